package policy

import (
	"fmt"
	"net/netip"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Direction is a traffic direction from the pod's point of view; values match
// bpf/coordino.h.
type Direction = policyir.Direction

const (
	// Ingress is traffic towards the pod.
	Ingress = policyir.Ingress
	// Egress is traffic leaving the pod.
	Egress = policyir.Egress
)

// Isolation holds the directions in which some policy selects a pod.
type Isolation uint32

const (
	// IngressIsolated: only allowed ingress passes. Value matches EP_INGRESS_ISOLATED.
	IngressIsolated Isolation = 1
	// EgressIsolated: only allowed egress passes. Value matches EP_EGRESS_ISOLATED.
	EgressIsolated Isolation = 2
	// IngressTiered: some ClusterNetworkPolicy has ingress rules for the
	// pod, so new ingress flows consult the policy map even where no
	// NetworkPolicy isolates it. Value matches EP_INGRESS_TIERED.
	IngressTiered Isolation = 4
	// EgressTiered is IngressTiered for egress (EP_EGRESS_TIERED).
	EgressTiered Isolation = 8
)

// Enforced reports whether new flows of direction d consult the policy
// map: some NetworkPolicy isolates d or some cluster policy has d rules.
func (i Isolation) Enforced(d Direction) bool {
	if d&1 == Egress {
		return i&(EgressIsolated|EgressTiered) != 0
	}
	return i&(IngressIsolated|IngressTiered) != 0
}

// Tiered reports whether some cluster policy has rules of direction d for
// the pod.
func (i Isolation) Tiered(d Direction) bool {
	if d&1 == Egress {
		return i&EgressTiered != 0
	}
	return i&IngressTiered != 0
}

// Has reports whether direction d is isolated by a NetworkPolicy.
func (i Isolation) Has(d Direction) bool {
	if d == Egress {
		return i&EgressIsolated != 0
	}
	return i&IngressIsolated != 0
}

// IP protocol numbers policies can name.
const (
	ProtoAny  = policyir.ProtoAny
	ProtoICMP = policyir.ProtoICMP
	ProtoTCP  = policyir.ProtoTCP
	ProtoUDP  = policyir.ProtoUDP
	ProtoSCTP = policyir.ProtoSCTP
)

// Snapshot is a complete, consistent set of policy inputs from a source.
type Snapshot struct {
	Policies []*networkingv1.NetworkPolicy
	// PolicyIRs are policies the controller compiled (Kubernetes mode).
	PolicyIRs []*coordinov1alpha1.PolicyIR
	// ClusterPolicies are policy.networking.k8s.io ClusterNetworkPolicies.
	ClusterPolicies []*cnpv1beta1.ClusterNetworkPolicy
	Namespaces      []*corev1.Namespace
	// NodeIsolation are the cluster's NodeIsolationPolicies (daemon/nodeiso).
	NodeIsolation []*coordinov1alpha1.NodeIsolationPolicy
	// Nodes are the cluster's nodes: the labels and addresses nodes peers
	// of ClusterNetworkPolicies select (NodeAddrs).
	Nodes []*corev1.Node
}

// Input is what Compile needs besides the snapshot: the known identities and
// which of them have endpoints on this node.
type Input struct {
	Snapshot
	// Identities are all known pod identities (local and remote).
	Identities []identity.Identity
	// Local are the identities to compile rules for.
	Local []identity.ID
	// NamedPorts are the pods' named container ports.
	NamedPorts []PodPorts
}

// Rule allows traffic of a local identity in one direction with a remote
// identity (identity.Any for every peer) on a protocol (ProtoAny for all)
// and an inclusive port range (0-65535 for all ports).
//
// A rule of a ClusterNetworkPolicy also carries its tier, action and rank
// (policyir.Policy.Rank); NetworkPolicy rules leave them zero (accept).
type Rule struct {
	Local  identity.ID
	Remote identity.ID
	Dir    Direction
	Proto  uint8
	PortLo uint16
	PortHi uint16
	Tier   policyir.Tier
	Action policyir.Action
	Rank   uint16
}

// String renders r for logs and test failures.
func (r Rule) String() string {
	s := fmt.Sprintf("%s %s remote=%s proto=%d ports=%d-%d", r.Local, r.Dir, r.Remote, r.Proto, r.PortLo, r.PortHi)
	if r.Tier != policyir.TierNetworkPolicy {
		s += fmt.Sprintf(" %s %s rank=%d", r.Tier, r.Action, r.Rank)
	}
	return s
}

// Result is compiled policy for the local identities.
type Result struct {
	// Isolation of every local identity some policy selects.
	Isolation map[identity.ID]Isolation
	// Rules, deduplicated and sorted.
	Rules []Rule
	// CIDRs maps every ipBlock prefix (cidr and except) to its identity.
	CIDRs map[netip.Prefix]identity.ID
	// Warnings lists rule parts that match nothing here.
	Warnings []string
	// Values are the policy map's keys with their values (tiers.go).
	Values map[Key]Value
}

// Lookup reads r's keys as the policy map holds them (for Decide).
func (r *Result) Lookup(k Key) (Value, bool) {
	v, ok := r.Values[k]
	return v, ok
}

// CIDRIdentity returns the identity of the longest ipBlock prefix containing
// addr, or identity.World; it is what the ipcache resolves addr's CIDR to.
func (r *Result) CIDRIdentity(addr netip.Addr) identity.ID {
	addr = addr.Unmap()
	best, bits := identity.World, -1
	for p, id := range r.CIDRs {
		if p.Contains(addr) && p.Bits() > bits {
			best, bits = id, p.Bits()
		}
	}
	return best
}
