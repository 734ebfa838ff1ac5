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
// (dec was decided on the address itself, which the datapath does not do).
// It reports whether it did.
func explainService(dp PolicyView, dir policy.Direction, peer netip.Addr, proto uint8, dec policy.Decision, v *inspectv1.DirectionVerdict, local string) bool {
	portProto := proto == policy.ProtoTCP || proto == policy.ProtoUDP || proto == policy.ProtoSCTP
	if dir != policy.Egress || !dec.Isolation.Enforced(dir) || !portProto || !dp.ServiceAddress(peer) {
		return false
	}
	v.SelectedBy, v.AllowedBy, v.DecidedBy = nil, nil, ""
	if err := dp.ServiceHookError(); err != nil {
		v.Verdict, v.Reason = "denied", datapath.ReasonName(datapath.ReasonServiceUnenforceable)
		v.Detail = fmt.Sprintf("%s egress: %s is in a Service CIDR and the post-DNAT hook is not attached (%v): new flows are dropped (fail closed)", local, peer, err)
		return true
	}
	v.Verdict, v.Reason = verdictAfterDNAT, ""
	v.Detail = fmt.Sprintf("%s egress: %s is in a Service CIDR: the datapath decides on the backend kube-proxy translates it to; explain with --to <backend pod> --port <its target port>", local, peer)
	return true
}
