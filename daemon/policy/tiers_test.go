package policy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// refDecide is the reference evaluator of the tiers: it walks the
// normalized policies per flow, in the order the API defines, without
// keys, folding or lookups. nodes are the cluster's nodes: a nodes peer
// matches addr when a node it selects has that address.
func refDecide(pols []*policyir.Policy, nsLabels map[string]labels.Set, nodes map[string]refNode, local identity.Identity,
	dir Direction, remote *identity.Identity, addr netip.Addr, proto uint8, port uint16) Verdict {
	selects := func(p *policyir.Policy) bool {
		if p.Cluster() {
			return p.NamespaceSelector.Matches(nsLabels[local.Namespace]) && p.PodSelector.Matches(labels.Set(local.Labels))
		}
		return p.Namespace == local.Namespace && p.PodSelector.Matches(labels.Set(local.Labels))
	}
	peerMatches := func(p *policyir.Policy, peer policyir.Peer) bool {
		if peer.Block != nil {
			return addr.IsValid() && peer.Block.Covers(netip.PrefixFrom(addr, addr.BitLen()))
		}
		if peer.NodeSelector != nil {
			for _, n := range nodes {
				if peer.NodeSelector.Matches(n.labels) && slices.Contains(n.addrs, addr) {
					return true
				}
			}
			return false
		}
		if remote == nil || remote.ID < identity.FirstPod { // not a pod
			return false
		}
		if peer.NamespaceSelector == nil {
			return remote.Namespace == p.Namespace && peer.PodSelector.Matches(labels.Set(remote.Labels))
		}
		return peer.NamespaceSelector.Matches(nsLabels[remote.Namespace]) && peer.PodSelector.Matches(labels.Set(remote.Labels))
	}
	ruleMatches := func(p *policyir.Policy, r *policyir.Rule) bool {
		if r.Direction != dir || r.NoPorts {
			return false
		}
		if len(r.Peers) > 0 && !slices.ContainsFunc(r.Peers, func(q policyir.Peer) bool { return peerMatches(p, q) }) {
			return false
		}
		if r.AllTraffic() {
			return true
		}
		return slices.ContainsFunc(r.Ports, func(pr policyir.PortRange) bool {
			return (pr.Protocol == ProtoAny || pr.Protocol == proto) && pr.First <= port && port <= pr.Last
		})
	}
	tier := func(t policyir.Tier) (tierEntry, bool) {
		var best tierEntry
		found := false
		for _, p := range pols {
			if p.Tier != t || !selects(p) {
				continue
			}
			for i := range p.Rules {
				if r := &p.Rules[i]; ruleMatches(p, r) {
					if e := (tierEntry{action: r.Action, rank: p.Rank(r)}); !found || e.before(best) {
						best, found = e, true
					}
				}
			}
		}
		return best, found
	}
	if a, ok := tier(policyir.TierAdmin); ok && a.action != policyir.ActionPass {
		return Verdict{Allow: a.action == policyir.ActionAccept, Tier: policyir.TierAdmin, Action: a.action, Rank: a.rank}
	}
	isolated, allowed := false, false
	for _, p := range pols {
		if p.Cluster() || !selects(p) {
			continue
		}
		if (dir == Ingress && p.IsolatesIngress) || (dir == Egress && p.IsolatesEgress) {
			isolated = true
		}
		for i := range p.Rules {
			allowed = allowed || ruleMatches(p, &p.Rules[i])
		}
	}
	if isolated {
		return Verdict{Allow: allowed}
	}
	if b, ok := tier(policyir.TierBaseline); ok && b.action != policyir.ActionPass {
		return Verdict{Allow: b.action == policyir.ActionAccept, Tier: policyir.TierBaseline, Action: b.action, Rank: b.rank}
	}
	return Verdict{Allow: true}
}

// refNode is a node as the reference evaluator sees it.
type refNode struct {
	labels labels.Set
	addrs  []netip.Addr
}

// tierNodeAddrs are the addresses random nodes take: inside and outside
// the random networks peers, one in IPv6.
var tierNodeAddrs = []netip.Addr{netip.MustParseAddr("10.0.1.50"), netip.MustParseAddr("10.0.9.9"),
	netip.MustParseAddr("192.168.7.1"), netip.MustParseAddr("172.16.5.5"), netip.MustParseAddr("fd00::5")}

type tierWorld struct {
	rng      *rand.Rand
	e        *Engine
	ids      []identity.Identity
	addrs    map[identity.ID]netip.Addr
	local    map[identity.ID]bool
	nsLabels map[string]labels.Set
	nodes    map[string]refNode
	pols     map[string]*policyir.Policy
	// mirror is the policy map as a writer following TakeChanges holds it.
	mirror map[Key]Value
}

func (w *tierWorld) sync() {
	for k := range w.e.TakeChanges().Keys {
		if w.e.WantsKey(k) {
			w.mirror[k] = w.e.KeyValue(k)
		} else {
			delete(w.mirror, k)
		}
	}
}

func (w *tierWorld) lookup(k Key) (Value, bool) {
	v, ok := w.mirror[k]
	return v, ok
}

var tierNamespaces = []string{"a", "b", "c"}

func (w *tierWorld) pick(xs ...string) string { return xs[w.rng.IntN(len(xs))] }

func (w *tierWorld) selector() *metav1.LabelSelector {
	switch w.rng.IntN(3) {
	case 0:
		return &metav1.LabelSelector{}
	case 1:
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": w.pick("web", "db")}}
	}
	return &metav1.LabelSelector{MatchLabels: map[string]string{"team": w.pick("x", "y")}}
}

func (w *tierWorld) protocols() []cnpv1beta1.ClusterNetworkPolicyProtocol {
	switch w.rng.IntN(4) {
	case 0:
		return []cnpv1beta1.ClusterNetworkPolicyProtocol{{TCP: &cnpv1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1beta1.Port{Number: 80}}}}
	case 1:
		return []cnpv1beta1.ClusterNetworkPolicyProtocol{{TCP: &cnpv1beta1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1beta1.Port{Range: &cnpv1beta1.PortRange{Start: 80, End: 90}}}}}
	case 2:
		return []cnpv1beta1.ClusterNetworkPolicyProtocol{{UDP: &cnpv1beta1.ClusterNetworkPolicyProtocolUDP{}}}
	}
	return nil
}

func (w *tierWorld) clusterPolicy(name string) *cnpv1beta1.ClusterNetworkPolicy {
	cnp := &cnpv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}
	cnp.Spec.Tier = cnpv1beta1.Tier(w.pick("Admin", "Baseline"))
	cnp.Spec.Priority = int32(w.rng.IntN(3))
	if w.rng.IntN(2) == 0 {
		cnp.Spec.Subject.Namespaces = w.selector()
	} else {
		cnp.Spec.Subject.Pods = &cnpv1beta1.NamespacedPod{NamespaceSelector: *w.selector(), PodSelector: *w.selector()}
	}
	action := func() cnpv1beta1.ClusterNetworkPolicyRuleAction {
		return cnpv1beta1.ClusterNetworkPolicyRuleAction(w.pick("Accept", "Deny", "Pass"))
	}
	for range w.rng.IntN(3) {
		var peer cnpv1beta1.ClusterNetworkPolicyIngressPeer
		if w.rng.IntN(2) == 0 {
			peer.Namespaces = w.selector()
		} else {
			peer.Pods = &cnpv1beta1.NamespacedPod{NamespaceSelector: *w.selector(), PodSelector: *w.selector()}
		}
		cnp.Spec.Ingress = append(cnp.Spec.Ingress, cnpv1beta1.ClusterNetworkPolicyIngressRule{
			Action: action(), From: []cnpv1beta1.ClusterNetworkPolicyIngressPeer{peer}, Protocols: w.protocols()})
	}
	for range w.rng.IntN(3) {
		var peer cnpv1beta1.ClusterNetworkPolicyEgressPeer
		switch w.rng.IntN(4) {
		case 0:
			peer.Namespaces = w.selector()
		case 1:
			peer.Pods = &cnpv1beta1.NamespacedPod{NamespaceSelector: *w.selector(), PodSelector: *w.selector()}
		case 2:
			peer.Nodes = &metav1.LabelSelector{MatchLabels: map[string]string{"role": w.pick("infra", "worker")}}
			if w.rng.IntN(4) == 0 {
				peer.Nodes = &metav1.LabelSelector{}
			}
		default:
			peer.Networks = []cnpv1beta1.CIDR{cnpv1beta1.CIDR(w.pick("10.0.0.0/16", "10.0.1.0/24", "192.168.0.0/16", "0.0.0.0/0"))}
		}
		cnp.Spec.Egress = append(cnp.Spec.Egress, cnpv1beta1.ClusterNetworkPolicyEgressRule{
			Action: action(), To: []cnpv1beta1.ClusterNetworkPolicyEgressPeer{peer}, Protocols: w.protocols()})
	}
	return cnp
}

func (w *tierWorld) networkPolicy(ns, name string) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	np.Spec.PodSelector = *w.selector()
	port := intstr.FromInt32(80)
	np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: w.selector()}}}}
	if w.rng.IntN(2) == 0 {
		np.Spec.Ingress[0].Ports = []networkingv1.NetworkPolicyPort{{Port: &port}}
	}
	if w.rng.IntN(2) == 0 {
		np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.0.1.0/24"}}}}}}
	}
	return np
}

// step applies one random change to the engine and the world.
func (w *tierWorld) step() string {
	switch w.rng.IntN(7) {
	case 0, 1:
		name := fmt.Sprintf("cnp%d", w.rng.IntN(4))
		p, err := policyir.NormalizeCluster(w.clusterPolicy(name))
		if err != nil {
			panic(err)
		}
		w.pols[p.Key()] = p
		w.e.UpsertPolicy(p)
		return "cnp " + name
	case 2:
		ns := w.pick(tierNamespaces...)
		name := fmt.Sprintf("np%d", w.rng.IntN(2))
		p, err := policyir.Normalize(w.networkPolicy(ns, name))
		if err != nil {
			panic(err)
		}
		w.pols[p.Key()] = p
		w.e.UpsertPolicy(p)
		return "np " + p.Key()
	case 3:
		keys := slices.Sorted(maps.Keys(w.pols))
		if len(keys) == 0 {
			return "noop"
		}
		p := w.pols[keys[w.rng.IntN(len(keys))]]
		delete(w.pols, p.Key())
		w.e.DeletePolicy(p.Namespace, p.Name)
		return "delete " + p.Key()
	case 4:
		ns := w.pick(tierNamespaces...)
		l := labels.Set{"team": w.pick("x", "y"), NamespaceNameLabel: ns}
		w.nsLabels[ns] = l
		w.e.SetNamespace(ns, map[string]string{"team": l["team"]})
		return "ns " + ns + " " + l["team"]
	case 5:
		return w.nodeStep()
	}
	id := w.ids[w.rng.IntN(len(w.ids))]
	if w.local[id.ID] {
		delete(w.local, id.ID)
		w.e.RemoveLocal(id.ID)
		return fmt.Sprintf("local -%d", id.ID)
	}
	w.local[id.ID] = true
	w.e.AddLocal(id)
	return fmt.Sprintf("local +%d", id.ID)
}

func (w *tierWorld) compare(t *testing.T, history []string) {
	t.Helper()
	pols := slices.Collect(maps.Values(w.pols))
	world := []netip.Addr{netip.MustParseAddr("10.0.1.200"), netip.MustParseAddr("10.0.7.7"), netip.MustParseAddr("192.168.3.3"), netip.MustParseAddr("172.16.0.1")}
	for _, l := range w.ids {
		if !w.local[l.ID] {
			continue
		}
		iso := w.e.Isolation(l.ID)
		for _, dir := range []Direction{Ingress, Egress} {
			check := func(remote *identity.Identity, addr netip.Addr) {
				f := Flow{Local: l.ID, Isolation: iso, Dir: dir, RemoteCIDR: w.e.CIDRIdentity(addr)}
				f.Remote = f.RemoteCIDR
				if remote != nil {
					f.Remote = remote.ID
				}
				for _, pp := range []struct {
					proto uint8
					port  uint16
				}{{ProtoTCP, 80}, {ProtoTCP, 85}, {ProtoTCP, 443}, {ProtoUDP, 53}} {
					f.Proto, f.Port = pp.proto, pp.port
					got := Decide(w.lookup, f)
					want := refDecide(pols, w.nsLabels, w.nodes, l, dir, remote, addr, pp.proto, pp.port)
					if got.Allow != want.Allow || got.Tier != want.Tier || got.Action != want.Action || got.Rank != want.Rank {
						t.Fatalf("local %d %s remote %v %s %d/%d: engine %+v, reference %+v\nhistory:\n  %s",
							l.ID, dir, f.Remote, addr, pp.proto, pp.port, got, want, strings.Join(history, "\n  "))
					}
				}
			}
			for i := range w.ids {
				check(&w.ids[i], w.addrs[w.ids[i].ID])
			}
			for _, a := range world {
				check(nil, a)
			}
			// Node addresses keep their node identity; the CIDR lookup
			// finds their prefix.
			nodeID := &identity.Identity{ID: identity.RemoteNode}
			for _, a := range tierNodeAddrs {
				check(nodeID, a)
			}
		}
	}
}

// TestTiersMatchReference drives the engine with random ClusterNetworkPolicies
// (both tiers, colliding priorities, Accept/Deny/Pass, pod, namespace and
// network and node peers, ports) beside NetworkPolicies and node label and
// address changes, and checks every flow's
// verdict, read from a map kept by TakeChanges as the datapath's is,
// against the reference evaluator after every change.
func TestTiersMatchReference(t *testing.T) {
	for seed := range uint64(30) {
		w := &tierWorld{rng: rand.New(rand.NewPCG(seed, 38)), e: NewEngine(identity.NewCIDRs()),
			addrs: map[identity.ID]netip.Addr{}, local: map[identity.ID]bool{}, nsLabels: map[string]labels.Set{}, nodes: map[string]refNode{}, pols: map[string]*policyir.Policy{}, mirror: map[Key]Value{}}
		for _, ns := range tierNamespaces {
			w.nsLabels[ns] = labels.Set{NamespaceNameLabel: ns}
			w.e.SetNamespace(ns, nil)
		}
		for i := range 6 {
			id := identity.Identity{ID: identity.FirstPod + identity.ID(i), Namespace: tierNamespaces[i%3],
				Labels: map[string]string{"app": []string{"web", "db"}[i/3]}}
			w.ids = append(w.ids, id)
			w.addrs[id.ID] = netip.AddrFrom4([4]byte{10, 0, 1, byte(i + 1)})
			w.e.UpsertIdentity(id)
		}
		var history []string
		for range 60 {
			history = append(history, w.step())
			w.sync()
			if errs := w.e.TakeErrors(); len(errs) > 0 {
				t.Fatalf("seed %d: engine errors %v", seed, errs)
			}
			w.compare(t, history)
		}
	}
}

// nodeStep sets a random node's labels and addresses, or deletes it.
func (w *tierWorld) nodeStep() string {
	name := fmt.Sprintf("node%d", w.rng.IntN(3))
	if w.rng.IntN(4) == 0 {
		delete(w.nodes, name)
		w.e.DeleteNode(name)
		return "node -" + name
	}
	n := refNode{labels: labels.Set{"role": w.pick("infra", "worker")}}
	for range 1 + w.rng.IntN(2) {
		n.addrs = append(n.addrs, tierNodeAddrs[w.rng.IntN(len(tierNodeAddrs))])
	}
	w.nodes[name] = n
	w.e.SetNode(name, n.labels, n.addrs)
	return fmt.Sprintf("node %s %s %v", name, n.labels, n.addrs)
}
