package policyir

import (
	"k8s.io/apimachinery/pkg/labels"
	"net/netip"
)

// Direction is a traffic direction from the selected pod's point of view;
// values match bpf/coordino.h.
type Direction uint8

const (
	// Ingress is traffic towards the pod.
	Ingress Direction = 0
	// Egress is traffic leaving the pod.
	Egress Direction = 1
)

// String returns "ingress" or "egress".
func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// IP protocol numbers a rule can name; ProtoAny means every protocol.
const (
	ProtoAny  uint8 = 0
	ProtoICMP uint8 = 1
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
	ProtoSCTP uint8 = 132
)

// Policy is one NetworkPolicy in normalized form.
type Policy struct {
	Namespace, Name string
	// PodSelector selects the pods of Namespace the policy applies to.
	PodSelector labels.Selector
	// IsolatesIngress and IsolatesEgress are the effective policyTypes.
	IsolatesIngress, IsolatesEgress bool
	// Rules are the allow rules of both directions, ingress first.
	Rules []Rule
	// Warnings name rule parts that match nothing.
	Warnings []string
}

// Key returns "namespace/name".
func (p *Policy) Key() string { return p.Namespace + "/" + p.Name }

// Rule allows traffic in one direction between the selected pods and the
// union of Peers on the union of Ports.
type Rule struct {
	Direction Direction
	// Peers is empty when the rule allows every peer.
	Peers []Peer
	// Ports and NamedPorts are both empty when the rule allows all traffic.
	Ports []PortRange
	// NamedPorts are container port names; each node resolves them from
	// the pods' container ports (see daemon/policy: ingress against the
	// selected pod, egress against the peer pods).
	NamedPorts []NamedPort
	// NoPorts marks a rule that matches no traffic at all.
	NoPorts bool
}

// AllTraffic reports whether the rule allows every protocol and port.
func (r *Rule) AllTraffic() bool { return len(r.Ports) == 0 && len(r.NamedPorts) == 0 }

// NamedPort is a port name of one protocol (ProtoAny: every protocol).
type NamedPort struct {
	Protocol uint8
	Name     string
}

// Peer is one peer of a rule: either pods chosen by selectors, or a CIDR
// block.
type Peer struct {
	// NamespaceSelector picks the peer's namespaces; nil means the
	// policy's own namespace.
	NamespaceSelector labels.Selector
	// PodSelector picks pods in those namespaces (labels.Everything() when
	// the peer names only namespaces). Nil for a CIDR peer.
	PodSelector labels.Selector
	// Block is set for an ipBlock peer.
	Block *IPBlock
}

// IPBlock is a CIDR minus the CIDRs in Except (each strictly inside it).
type IPBlock struct {
	CIDR   netip.Prefix
	Except []netip.Prefix
}

// Prefixes returns the CIDR and its exceptions.
func (b *IPBlock) Prefixes() []netip.Prefix {
	return append([]netip.Prefix{b.CIDR}, b.Except...)
}

// Covers reports whether every address of prefix q lies in the block: q is
// inside CIDR and not inside an exception.
func (b *IPBlock) Covers(q netip.Prefix) bool {
	if !Within(q, b.CIDR) {
		return false
	}
	for _, e := range b.Except {
		if Within(q, e) {
			return false
		}
	}
	return true
}

// Within reports whether prefix q lies inside prefix p.
func Within(q, p netip.Prefix) bool {
	return q.Addr().Is4() == p.Addr().Is4() && q.Bits() >= p.Bits() && p.Contains(q.Addr())
}

// PortRange is an inclusive port range of one protocol; a range of
// ProtoAny, or 0-65535, covers the whole protocol.
type PortRange struct {
	Protocol    uint8
	First, Last uint16
}
