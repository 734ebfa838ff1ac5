package inspect

import (
	"fmt"
	"net/netip"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/policy"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// verdictAfterDNAT is the egress verdict of a flow to a Service address
// from an egress-isolated pod: the datapath decides it on the backend
// kube-proxy picks, which no query made before the packet exists can know.
const verdictAfterDNAT = "decided-after-dnat"

// explainService rewrites the egress step v of a flow to a Service address
// or a node port (dec was decided on the address itself, which the
// datapath does not do). It reports whether it did.
func explainService(dp PolicyView, dir policy.Direction, peer netip.Addr, proto uint8, port uint16, dec policy.Decision, v *inspectv1.DirectionVerdict, local string) bool {
	portProto := proto == policy.ProtoTCP || proto == policy.ProtoUDP || proto == policy.ProtoSCTP
	if dir != policy.Egress || !dec.Isolation.Enforced(dir) || !portProto || !dp.ServiceTarget(peer, proto, port) {
		return false
	}
	what := "is in a Service CIDR"
	if !dp.ServiceAddress(peer) {
		what = fmt.Sprintf("port %d is a NodePort of this node", port)
	}
	v.SelectedBy, v.AllowedBy, v.DecidedBy = nil, nil, ""
	if err := dp.ServiceHookError(); err != nil {
		v.Verdict, v.Reason = "denied", datapath.ReasonName(datapath.ReasonServiceUnenforceable)
		v.Detail = fmt.Sprintf("%s egress: %s %s and the post-DNAT hook is not attached (%v): new flows are dropped (fail closed)", local, peer, what, err)
		return true
	}
	v.Verdict, v.Reason = verdictAfterDNAT, ""
	v.Detail = fmt.Sprintf("%s egress: %s %s: the datapath decides on the backend kube-proxy translates it to; explain with --to <backend pod> --port <its target port>", local, peer, what)
	return true
}
