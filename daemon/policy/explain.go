package policy

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
)

// Decision is the verdict a datapath reaches for a new flow at one
// endpoint, with the identities and isolation that led to it. Both
// datapaths produce it from what they enforce, and one Explainer names
// the rules behind it, so explain reads the same in either mode.
type Decision struct {
	Local      identity.ID
	Remote     identity.ID
	RemoteCIDR identity.ID
	Isolation  Isolation
	// Verdict is the decision and, when a ClusterNetworkPolicy rule made
	// it, its tier, action and rank.
	Verdict
}

// Allowed reports whether the decision lets the flow pass.
func (dec Decision) Allowed() bool { return dec.Allow }

// Explainer names the policies behind decisions. Each policy, and each of
// its rules, is compiled on its own by the same pipeline that feeds the
// datapaths; the peer's CIDR identity is re-resolved in each such
// compilation, since an ipBlock matches by address. Pod peers are matched
// among Identities (peers known only from a cluster source are not named).
type Explainer struct {
	objects    []Object // sorted by key
	namespaces []*corev1.Namespace
	nodes      []*corev1.Node
	ids        []identity.Identity
	ports      []PodPorts
	cidrs      *identity.CIDRs
}

// NewExplainer takes the policies in force (st, the last snapshot), the
// identities of this node's endpoints, the pods' named ports and the CIDR
// identities the datapath uses.
func NewExplainer(st *SnapshotState, ids []identity.Identity, ports []PodPorts, cidrs *identity.CIDRs) Explainer {
	objs := slices.Collect(maps.Values(st.Policies))
	slices.SortFunc(objs, func(a, b Object) int { return strings.Compare(a.Key, b.Key) })
	var nodes []*corev1.Node
	for name, n := range st.Nodes {
		nodes = append(nodes, n.object(name))
	}
	return Explainer{objects: objs, namespaces: slices.Collect(maps.Values(st.Namespaces)), nodes: nodes, ids: ids, ports: ports, cidrs: cidrs}
}

// compile compiles o alone for local.
func (x Explainer) compile(local identity.ID, o Object) *Result {
	snap := o.Snapshot()
	snap.Namespaces, snap.Nodes = x.namespaces, x.nodes
	res, _ := Compile(Input{Snapshot: snap, Identities: x.ids, Local: []identity.ID{local}, NamedPorts: x.ports}, x.cidrs)
	return res
}

// Provenance names the policies behind a decision at a local endpoint:
// those selecting its identity for dir, and the rules ("namespace/name
// spec.ingress[0]") that allow the flow with peer.
func (x Explainer) Provenance(dec Decision, dir Direction, peer netip.Addr, proto uint8, port uint16) (selectedBy, allowedBy []string) {
	for _, o := range x.objects {
		res := x.compile(dec.Local, o)
		if res == nil || !res.Isolation[dec.Local].Has(dir) {
			continue
		}
		selectedBy = append(selectedBy, o.Key)
		fields, parts := o.RulesOf(dir)
		for i, one := range parts {
			r := x.compile(dec.Local, one)
			if r == nil {
				continue
			}
			if r.Table().Allowed(provenanceFlow(dec, r, dir, peer, proto, port)) {
				allowedBy = append(allowedBy, o.Key+" "+fields[i])
			}
		}
	}
	return selectedBy, allowedBy
}

// DecidedBy names the ClusterNetworkPolicy rule behind a decision of a
// tier, "admin: ClusterNetworkPolicy/deny-tenants spec.egress[1] Deny",
// or returns "" when no tier rule decided. The candidates are the cluster
// policies of the decision's tier and priority (the rank holds both); each
// is compiled alone, and the one whose own verdict is the decision's is
// named.
func (x Explainer) DecidedBy(dec Decision, dir Direction, peer netip.Addr, proto uint8, port uint16) string {
	if dec.Tier == policyir.TierNetworkPolicy {
		return ""
	}
	index := int(dec.Rank) % policyir.MaxRulesPerDirection
	for _, o := range x.objects {
		if _, ok := o.Source.(*cnpv1beta1.ClusterNetworkPolicy); !ok {
			continue
		}
		p, err := o.Normalize()
		if err != nil || p.Tier != dec.Tier || p.Rank(&policyir.Rule{Index: index}) != dec.Rank {
			continue
		}
		r := x.compile(dec.Local, o)
		if r == nil {
			continue
		}
		v := Decide(r.Lookup, provenanceFlow(dec, r, dir, peer, proto, port))
		if v.Tier == dec.Tier && v.Action == dec.Action && v.Rank == dec.Rank {
			return fmt.Sprintf("%s: %s spec.%s[%d] %s", dec.Tier, p.Object(), dir, index, dec.Action)
		}
	}
	return ""
}

// provenanceFlow is the decision's flow under r, one object's compilation:
// the peer's CIDR identity is re-resolved there, since an ipBlock or
// networks peer matches by address.
func provenanceFlow(dec Decision, r *Result, dir Direction, peer netip.Addr, proto uint8, port uint16) Flow {
	f := Flow{Local: dec.Local, Isolation: r.Isolation[dec.Local], Dir: dir,
		Remote: dec.Remote, RemoteCIDR: r.CIDRIdentity(peer), Proto: proto, Port: port}
	if dec.Remote.IsCIDR() || dec.Remote == identity.World {
		f.Remote = f.RemoteCIDR
	}
	return f
}

// DescribeIdentity says what an identity stands for, as the engine knows
// it. Callers serialise it with the engine's other uses.
func (e *Engine) DescribeIdentity(id identity.ID) string {
	switch id {
	case identity.Host:
		return "the node itself (host)"
	case identity.World:
		return "outside the cluster (world: no pod, node or policy ipBlock covers the address)"
	case identity.RemoteNode:
		return "another node (remote-node)"
	}
	if id.IsCIDR() {
		if p, ok := e.PrefixOf(id); ok {
			if name, ok := e.nodeOf(p); ok {
				return fmt.Sprintf("ipBlock %s, an address of node %s (%s)", p, name, id)
			}
			return fmt.Sprintf("ipBlock %s (%s)", p, id)
		}
		return fmt.Sprintf("an ipBlock no policy uses any more (%s)", id)
	}
	if ident, ok := e.Identity(id); ok {
		return fmt.Sprintf("pods in namespace %s with labels %s", ident.Namespace, labelString(ident.Labels))
	}
	return "unknown to this node"
}

func labelString(m map[string]string) string {
	if len(m) == 0 {
		return "{} (no labels)"
	}
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}
