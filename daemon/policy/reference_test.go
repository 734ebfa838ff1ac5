package policy

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func refParseCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	return p.Masked(), err
}

func refProtoNumber(p *corev1.Protocol) (uint8, error) {
	if p == nil {
		return ProtoTCP, nil
	}
	return map[corev1.Protocol]uint8{corev1.ProtocolTCP: ProtoTCP, corev1.ProtocolUDP: ProtoUDP, corev1.ProtocolSCTP: ProtoSCTP}[*p], nil
}

// portRange is an inclusive protocol/port range; ProtoAny means everything.
type portRange struct {
	proto  uint8
	lo, hi uint16
}

var refAllTraffic = []portRange{{proto: ProtoAny, lo: 0, hi: 65535}}

type refCompiler struct {
	in       *Input
	cidrs    *identity.CIDRs
	nsLabels map[string]labels.Set
	prefixes []netip.Prefix
	res      *Result
	rules    map[Rule]bool
}

// referenceCompile is the former whole-snapshot compiler, kept as the test
// oracle for the incremental engine.
func referenceCompile(in Input, cidrs *identity.CIDRs) (*Result, error) {
	c := &refCompiler{
		in:       &in,
		cidrs:    cidrs,
		nsLabels: map[string]labels.Set{},
		res:      &Result{Isolation: map[identity.ID]Isolation{}, CIDRs: map[netip.Prefix]identity.ID{}},
		rules:    map[Rule]bool{},
	}
	for _, ns := range in.Namespaces {
		l := labels.Set(maps.Clone(ns.Labels))
		if l == nil {
			l = labels.Set{}
		}
		l[NamespaceNameLabel] = ns.Name
		c.nsLabels[ns.Name] = l
	}

	// Stage 1: validate; invalid policies are dropped, not half-applied.
	var errs []error
	valid := make([]*networkingv1.NetworkPolicy, 0, len(in.Policies))
	for _, np := range in.Policies {
		if err := policyir.ValidateNetworkPolicy(np); err != nil {
			errs = append(errs, fmt.Errorf("networkpolicy %s/%s: %w", np.Namespace, np.Name, err))
			continue
		}
		valid = append(valid, np)
	}
	// Stage 2: every ipBlock prefix gets a CIDR identity before peers resolve.
	if err := c.collectPrefixes(valid); err != nil {
		return nil, err
	}
	// Stages 3-5: select local identities, resolve peers, expand ports.
	local := map[identity.ID]bool{}
	for _, id := range in.Local {
		local[id] = true
	}
	for _, np := range valid {
		selector, _ := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		ingress, egress := refPolicyTypes(np)
		for _, id := range in.Identities {
			if !local[id.ID] || id.Namespace != np.Namespace || !selector.Matches(labels.Set(id.Labels)) {
				continue
			}
			if ingress {
				c.res.Isolation[id.ID] |= IngressIsolated
				for _, r := range np.Spec.Ingress {
					c.addRules(np, id.ID, Ingress, r.From, r.Ports)
				}
			}
			if egress {
				c.res.Isolation[id.ID] |= EgressIsolated
				for _, r := range np.Spec.Egress {
					c.addRules(np, id.ID, Egress, r.To, r.Ports)
				}
			}
		}
	}
	c.res.Rules = slices.SortedFunc(maps.Keys(c.rules), compareRules)
	slices.Sort(c.res.Warnings)
	c.res.Warnings = slices.Compact(c.res.Warnings)
	if len(errs) > 0 {
		return c.res, joinErrors(errs)
	}
	return c.res, nil
}

// policyTypes applies the API default: Ingress always, Egress when the
// policy has egress rules.
func refPolicyTypes(np *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

func (c *refCompiler) collectPrefixes(nps []*networkingv1.NetworkPolicy) error {
	seen := map[netip.Prefix]bool{}
	add := func(s string) {
		if p, err := refParseCIDR(s); err == nil && !seen[p] {
			seen[p] = true
			c.prefixes = append(c.prefixes, p)
		}
	}
	for _, np := range nps {
		for _, peers := range peerLists(np) {
			for _, p := range peers {
				if p.IPBlock == nil {
					continue
				}
				add(p.IPBlock.CIDR)
				for _, e := range p.IPBlock.Except {
					add(e)
				}
			}
		}
	}
	slices.SortFunc(c.prefixes, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	for _, p := range c.prefixes {
		id, err := c.cidrs.Get(p)
		if err != nil {
			return err
		}
		c.res.CIDRs[p] = id
	}
	return nil
}

func peerLists(np *networkingv1.NetworkPolicy) [][]networkingv1.NetworkPolicyPeer {
	var out [][]networkingv1.NetworkPolicyPeer
	for _, r := range np.Spec.Ingress {
		out = append(out, r.From)
	}
	for _, r := range np.Spec.Egress {
		out = append(out, r.To)
	}
	return out
}

func (c *refCompiler) addRules(np *networkingv1.NetworkPolicy, local identity.ID, dir Direction,
	peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) {
	remotes := []identity.ID{identity.Any}
	if len(peers) > 0 {
		remotes = nil
		for _, p := range peers {
			remotes = append(remotes, c.peerIdentities(np, p)...)
		}
	}
	for _, r := range remotes {
		ranges := refAllTraffic
		if len(ports) > 0 {
			ranges = append(c.portRanges(ports), c.namedPortRanges(local, dir, r, ports)...)
		}
		for _, pr := range ranges {
			c.rules[Rule{Local: local, Remote: r, Dir: dir, Proto: pr.proto, PortLo: pr.lo, PortHi: pr.hi}] = true
		}
	}
}

// namedPortRanges resolves the named ports of a rule for one (local,
// remote) pair: ingress from the local identity's pods on this node, egress
// from the remote identity's pods, or from every pod for a remote that is
// not a pod identity.
func (c *refCompiler) namedPortRanges(local identity.ID, dir Direction, remote identity.ID, ports []networkingv1.NetworkPolicyPort) []portRange {
	var out []portRange
	for _, pod := range c.in.NamedPorts {
		switch {
		case dir == Ingress && (!pod.Local || pod.ID != local):
			continue
		case dir == Egress && remote >= identity.FirstPod && !remote.IsCIDR() && pod.ID != remote:
			continue
		}
		for _, np := range pod.Ports {
			for _, p := range ports {
				proto, _ := refProtoNumber(p.Protocol)
				if p.Port != nil && p.Port.Type == intstr.String && p.Port.StrVal == np.Name && proto == np.Protocol {
					out = append(out, portRange{proto: proto, lo: np.Port, hi: np.Port})
				}
			}
		}
	}
	return out
}

// peerIdentities resolves one peer. Selectors match known pod identities;
// an ipBlock matches every CIDR identity whose prefix lies inside cidr and
// outside each except: the ipcache resolves an address to its longest known
// prefix, and that prefix is inside a block exactly when the address is.
func (c *refCompiler) peerIdentities(np *networkingv1.NetworkPolicy, p networkingv1.NetworkPolicyPeer) []identity.ID {
	var out []identity.ID
	if p.IPBlock != nil {
		block, _ := refParseCIDR(p.IPBlock.CIDR)
		var except []netip.Prefix
		for _, e := range p.IPBlock.Except {
			ex, _ := refParseCIDR(e)
			except = append(except, ex)
		}
		for _, q := range c.prefixes {
			if !policyir.Within(q, block) || slices.ContainsFunc(except, func(e netip.Prefix) bool { return policyir.Within(q, e) }) {
				continue
			}
			out = append(out, c.res.CIDRs[q])
		}
		return out
	}
	podSel := labels.Everything()
	if p.PodSelector != nil {
		podSel, _ = metav1.LabelSelectorAsSelector(p.PodSelector)
	}
	var nsSel labels.Selector
	if p.NamespaceSelector != nil {
		nsSel, _ = metav1.LabelSelectorAsSelector(p.NamespaceSelector)
	}
	for _, id := range c.in.Identities {
		if nsSel == nil && id.Namespace != np.Namespace {
			continue
		}
		if nsSel != nil && !nsSel.Matches(c.namespaceLabels(id.Namespace)) {
			continue
		}
		if podSel.Matches(labels.Set(id.Labels)) {
			out = append(out, id.ID)
		}
	}
	return out
}

func (c *refCompiler) namespaceLabels(ns string) labels.Set {
	if l, ok := c.nsLabels[ns]; ok {
		return l
	}
	// A namespace without an object still has its name label.
	return labels.Set{NamespaceNameLabel: ns}
}

func (c *refCompiler) portRanges(ports []networkingv1.NetworkPolicyPort) []portRange {
	var out []portRange
	for _, p := range ports {
		proto, _ := refProtoNumber(p.Protocol)
		switch {
		case p.Port == nil:
			out = append(out, portRange{proto: proto, lo: 0, hi: 65535})
		case p.Port.Type == intstr.String:
			// Resolved per pair by namedPortRanges.
		default:
			lo := uint16(p.Port.IntVal)
			hi := lo
			if p.Port != nil && p.EndPort != nil {
				hi = uint16(*p.EndPort)
			}
			out = append(out, portRange{proto: proto, lo: lo, hi: hi})
		}
	}
	return out
}
