package inspect

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/policy"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// side is one end of an explained flow.
type side struct {
	query string
	addrs []netip.Addr
	// ep is the attachment when the side is a pod of this node.
	ep *inspectv1.Endpoint
}

func (sd side) name() string {
	if sd.ep != nil && sd.ep.PodName != "" {
		return sd.ep.PodNamespace + "/" + sd.ep.PodName
	}
	if sd.ep != nil {
		return sd.ep.Key
	}
	return sd.query
}

// ExplainPolicy implements Inspector.ExplainPolicy: both enforcement points
// of a new flow — the source pod's egress and the destination pod's ingress
// — are decided by looking up the kernel's maps as the programs do, and the
// policies and rules behind each decision are named.
func (s *Service) ExplainPolicy(_ context.Context, req *inspectv1.ExplainPolicyRequest) (*inspectv1.PolicyExplanation, error) {
	dp := s.cfg.Policy
	if dp == nil {
		return nil, status.Error(codes.FailedPrecondition, "the datapath is disabled (--no-datapath): no policy is enforced on this node")
	}
	eps, err := s.endpoints()
	if err != nil {
		return nil, err
	}
	from, err := resolveSide(eps, req.From, "from")
	if err != nil {
		return nil, err
	}
	to, err := resolveSide(eps, req.To, "to")
	if err != nil {
		return nil, err
	}
	src, dst, err := pickFamily(from, to)
	if err != nil {
		return nil, err
	}
	proto, err := protocolNumber(req.Protocol, src.Is6())
	if err != nil {
		return nil, err
	}
	if req.Port > 65535 {
		return nil, status.Errorf(codes.InvalidArgument, "port %d: must be 0-65535", req.Port)
	}
	port := uint16(req.Port)
	out := &inspectv1.PolicyExplanation{Src: src.String(), Dst: dst.String(), Verdict: "allowed"}
	steps := []struct {
		at       side
		dir      policy.Direction
		peer     netip.Addr
		peerName string
	}{
		{from, policy.Egress, dst, to.name()},
		{to, policy.Ingress, src, from.name()},
	}
	var denied []string
	for _, st := range steps {
		v := &inspectv1.DirectionVerdict{Direction: st.dir.String()}
		out.Steps = append(out.Steps, v)
		if st.at.ep == nil || st.at.ep.HostIfindex == 0 {
			v.Verdict = "not-enforced-here"
			v.Detail = fmt.Sprintf("%s is not a pod attached on this node; its own node (if any) decides %s", st.at.name(), st.dir)
			continue
		}
		v.Endpoint = st.at.name()
		dec, err := dp.Decide(int(st.at.ep.HostIfindex), st.dir, st.peer, proto, port)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
		v.LocalIdentity, v.RemoteIdentity, v.RemoteCidrIdentity = uint32(dec.Local), uint32(dec.Remote), uint32(dec.RemoteCIDR)
		v.RemoteDescription = remoteDescription(dp, dec)
		v.Reason = dec.Reason
		v.Verdict = "allowed"
		if !dec.Allowed() {
			v.Verdict = "denied"
		}
		if dec.Tier != policyir.TierNetworkPolicy {
			v.DecidedBy = dp.DecidedBy(dec, st.dir, st.peer, proto, port)
		} else if dec.Isolation.Has(st.dir) && dec.Reason != "host" {
			v.SelectedBy, v.AllowedBy = dp.Provenance(dec, st.dir, st.peer, proto, port)
		}
		v.Detail = describe(dec, st.dir, v, st.at.name(), st.peerName, req.Protocol, port)
		if explainService(dp, st.dir, st.peer, proto, port, dec, v, st.at.name()) && v.Verdict == verdictAfterDNAT {
			out.Verdict = verdictAfterDNAT
		}
		if v.Verdict == "denied" {
			out.Verdict = "denied"
			denied = append(denied, v.Detail)
		}
	}
	if out.Verdict == "denied" {
		out.Summary = "denied: " + strings.Join(denied, "; ")
	} else if out.Verdict == verdictAfterDNAT {
		out.Summary = out.Steps[0].Detail
	} else {
		out.Summary = "allowed"
		for _, st := range out.Steps {
			if st.Verdict == "allowed" {
				out.Summary += "; " + st.Detail
			}
		}
	}
	return out, nil
}

// remoteDescription says what the peer's identity stands for, and which
// ipBlock its address falls in when a policy's ipBlock covers it.
func remoteDescription(dp PolicyView, dec policy.Decision) string {
	d := fmt.Sprintf("identity %d: %s", uint32(dec.Remote), dp.DescribeIdentity(dec.Remote))
	if dec.RemoteCIDR.IsCIDR() && dec.RemoteCIDR != dec.Remote {
		d += "; its address is in " + dp.DescribeIdentity(dec.RemoteCIDR)
	}
	return d
}

func describe(dec policy.Decision, dir policy.Direction, v *inspectv1.DirectionVerdict, local, peer, proto string, port uint16) string {
	if dec.Tier != policyir.TierNetworkPolicy {
		by := v.DecidedBy
		if by == "" {
			by = fmt.Sprintf("%s tier rule of rank %d, %s", dec.Tier, dec.Rank, dec.Action)
		}
		return fmt.Sprintf("%s %s: decided by %s", local, dir, by)
	}
	switch dec.Reason {
	case "host":
		return fmt.Sprintf("%s ingress: traffic from the node itself is always allowed", local)
	case "not-isolated":
		return fmt.Sprintf("%s %s: no policy selects the pod for %s, so it is open", local, dir, dir)
	case "policy":
		return fmt.Sprintf("%s %s: allowed by %s", local, dir, strings.Join(v.AllowedBy, ", "))
	}
	return fmt.Sprintf("%s %s: default deny of %s (the pod is isolated for %s) and no rule allows %s (identity %s) on %s/%d",
		local, dir, strings.Join(v.SelectedBy, ", "), dir, peer, dec.Remote, strings.ToUpper(proto), port)
}

// resolveSide finds a pod of this node by query, else parses an address or
// CIDR (its first address stands for it); a pod address also finds its pod.
func resolveSide(eps []*inspectv1.Endpoint, q, field string) (side, error) {
	sd := side{query: q}
	if q == "" {
		return sd, status.Errorf(codes.InvalidArgument, "%s: give a pod (namespace/name, name or container ID), an address or a CIDR", field)
	}
	var addr netip.Addr
	if p, err := netip.ParsePrefix(q); err == nil {
		addr = p.Masked().Addr()
	} else if a, err := netip.ParseAddr(q); err == nil {
		addr = a
	}
	if addr.IsValid() {
		sd.addrs = []netip.Addr{addr.Unmap()}
		for _, e := range eps {
			for _, ip := range e.Ips {
				if ip == addr.Unmap().String() {
					sd.ep = e
				}
			}
		}
		return sd, nil
	}
	e, err := findEndpoint(eps, q)
	if err != nil {
		return sd, status.Errorf(status.Code(err), "%s: %s", field, status.Convert(err).Message())
	}
	sd.ep = e
	for _, ip := range e.Ips {
		if a, err := netip.ParseAddr(ip); err == nil {
			sd.addrs = append(sd.addrs, a)
		}
	}
	if len(sd.addrs) == 0 {
		return sd, status.Errorf(codes.FailedPrecondition, "%s: endpoint %s has no addresses", field, e.Key)
	}
	return sd, nil
}

// pickFamily chooses one address per side of the same family, IPv4 first.
func pickFamily(from, to side) (netip.Addr, netip.Addr, error) {
	for _, v4 := range []bool{true, false} {
		var src, dst netip.Addr
		for _, a := range from.addrs {
			if a.Is4() == v4 && !src.IsValid() {
				src = a
			}
		}
		for _, a := range to.addrs {
			if a.Is4() == v4 && !dst.IsValid() {
				dst = a
			}
		}
		if src.IsValid() && dst.IsValid() {
			return src, dst, nil
		}
	}
	return netip.Addr{}, netip.Addr{}, status.Errorf(codes.InvalidArgument, "from %s and to %s share no address family", from.name(), to.name())
}

func protocolNumber(name string, v6 bool) (uint8, error) {
	switch strings.ToUpper(name) {
	case "", "TCP":
		return policy.ProtoTCP, nil
	case "UDP":
		return policy.ProtoUDP, nil
	case "SCTP":
		return policy.ProtoSCTP, nil
	case "ICMP", "ICMPV6":
		if v6 {
			return 58, nil
		}
		return policy.ProtoICMP, nil
	}
	return 0, status.Errorf(codes.InvalidArgument, "protocol %q: must be TCP, UDP, SCTP or ICMP", name)
}
