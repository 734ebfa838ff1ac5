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

// Tier orders policies: the Admin tier of ClusterNetworkPolicy decides
// first, then NetworkPolicy, then the Baseline tier.
type Tier uint8

const (
	// TierNetworkPolicy is namespaced NetworkPolicy (the zero value).
	TierNetworkPolicy Tier = 0
	// TierAdmin is ClusterNetworkPolicy's Admin tier.
	TierAdmin Tier = 1
	// TierBaseline is ClusterNetworkPolicy's Baseline tier.
	TierBaseline Tier = 2
)

// String returns "networkpolicy", "admin" or "baseline".
func (t Tier) String() string {
	switch t {
	case TierAdmin:
		return "admin"
	case TierBaseline:
		return "baseline"
	}
	return "networkpolicy"
}

// Action is what a rule does with the traffic it matches. NetworkPolicy
// rules only accept.
type Action uint8

const (
	// ActionAccept allows the traffic (the zero value: NetworkPolicy rules).
	ActionAccept Action = 0
	// ActionDeny drops it; no later tier is consulted.
	ActionDeny Action = 1
	// ActionPass skips the rest of its tier: the next tier decides.
	ActionPass Action = 2
)

// String returns "Accept", "Deny" or "Pass".
func (a Action) String() string {
	switch a {
	case ActionDeny:
		return "Deny"
	case ActionPass:
		return "Pass"
	}
	return "Accept"
}

// Bounds of a ClusterNetworkPolicy: its priority and its rules per
// direction. Rank relies on them to order every rule of a tier in 15 bits.
const (
	MaxPriority          = 1000
	MaxRulesPerDirection = 25
)

// Policy is one NetworkPolicy or ClusterNetworkPolicy in normalized form.
type Policy struct {
	// Namespace is empty for a ClusterNetworkPolicy.
	Namespace, Name string
	// Tier is TierNetworkPolicy for a NetworkPolicy.
	Tier Tier
	// Priority orders the policies of a tier, lowest first (0-1000).
	Priority int32
	// NamespaceSelector picks the namespaces of a cluster policy's subject;
	// nil for a NetworkPolicy (its own namespace).
	NamespaceSelector labels.Selector
	// PodSelector selects the pods the policy applies to: in Namespace, or
	// in the namespaces NamespaceSelector picks.
	PodSelector labels.Selector
	// IsolatesIngress and IsolatesEgress are the effective policyTypes.
	IsolatesIngress, IsolatesEgress bool
	// Rules are the allow rules of both directions, ingress first.
	Rules []Rule
	// Warnings name rule parts that match nothing.
	Warnings []string
}

// Key returns "namespace/name", or "/name" for a cluster policy.
func (p *Policy) Key() string { return p.Namespace + "/" + p.Name }

// Cluster reports whether p is a ClusterNetworkPolicy.
func (p *Policy) Cluster() bool { return p.Tier != TierNetworkPolicy }

// Rank orders rule r of a cluster policy within its tier: by priority,
// then by the rule's index in its direction; lower decides first.
func (p *Policy) Rank(r *Rule) uint16 {
	return uint16(p.Priority)*MaxRulesPerDirection + uint16(r.Index)
}

// Object names the policy as explain and flows show it.
func (p *Policy) Object() string {
	if p.Cluster() {
		return "ClusterNetworkPolicy/" + p.Name
	}
	return "NetworkPolicy/" + p.Namespace + "/" + p.Name
}

// Rule allows traffic in one direction between the selected pods and the
// union of Peers on the union of Ports.
type Rule struct {
	Direction Direction
	// Action is ActionAccept for every NetworkPolicy rule.
	Action Action
	// Index is the rule's position in its direction's list
	// (spec.ingress[Index] or spec.egress[Index]) of a cluster policy.
	Index int
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

// Peer is one peer of a rule: pods chosen by selectors, a CIDR block, or
// nodes chosen by their labels.
type Peer struct {
	// NamespaceSelector picks the peer's namespaces; nil means the
	// policy's own namespace.
	NamespaceSelector labels.Selector
	// PodSelector picks pods in those namespaces (labels.Everything() when
	// the peer names only namespaces). Nil for a CIDR peer.
	PodSelector labels.Selector
	// Block is set for an ipBlock peer.
	Block *IPBlock
	// NodeSelector is set for a nodes peer of a ClusterNetworkPolicy: the
	// addresses of the nodes whose labels it matches (each node's own
	// prefix, /32 or /128, through the ipcache's CIDR identities).
	NodeSelector labels.Selector
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
