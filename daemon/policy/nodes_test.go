package policy

import (
	"fmt"
	"net/netip"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// TestNodePeerEvents: a node event touches only the nodes peers that
// select the node before or after it: a node no selector names changes
// nothing, a selected one brings its addresses' host prefixes in as CIDR
// identities, and relabeling or deleting it releases them.
func TestNodePeerEvents(t *testing.T) {
	e := NewEngine(identity.NewCIDRs())
	e.SetNamespace("a", nil)
	e.AddLocal(identity.Identity{ID: identity.FirstPod, Namespace: "a", Labels: map[string]string{"app": "web"}})
	cnp := &cnpv1beta1.ClusterNetworkPolicy{}
	if err := yaml.UnmarshalStrict([]byte(`
metadata: {name: deny-infra}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  egress: [{action: Deny, to: [{nodes: {matchLabels: {role: infra}}}]}]`), cnp); err != nil {
		t.Fatal(err)
	}
	p, err := policyir.NormalizeCluster(cnp)
	if err != nil {
		t.Fatal(err)
	}
	e.UpsertPolicy(p)
	e.TakeChanges()
	v4, v6 := netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")
	host4, host6 := netip.PrefixFrom(v4, 32), netip.PrefixFrom(v6, 128)
	denied := func(addr netip.Addr) bool {
		f := Flow{Local: identity.FirstPod, Isolation: e.Isolation(identity.FirstPod), Dir: Egress,
			Remote: identity.RemoteNode, RemoteCIDR: e.CIDRIdentity(addr), Proto: ProtoTCP, Port: 80}
		return !Decide(func(k Key) (Value, bool) { v := e.KeyValue(k); return v, e.WantsKey(k) }, f).Allow
	}

	e.SetNode("w1", map[string]string{"role": "worker"}, []netip.Addr{v4})
	if ch := e.TakeChanges(); !ch.Empty() {
		t.Errorf("a node no selector names changed %+v", ch)
	}
	e.SetNode("i1", map[string]string{"role": "infra"}, []netip.Addr{v6, v4})
	ch := e.TakeChanges()
	if _, ok := ch.Prefixes[host4]; !ok || len(ch.Prefixes) != 2 {
		t.Errorf("selected node: prefixes changed %v, want %s and %s", ch.Prefixes, host4, host6)
	}
	if !e.CIDRIdentity(v4).IsCIDR() || !denied(v4) || !denied(v6) {
		t.Errorf("selected node's addresses: CIDR identity %s, denied %v %v", e.CIDRIdentity(v4), denied(v4), denied(v6))
	}
	if got, want := e.DescribeIdentity(e.CIDRIdentity(v6)), fmt.Sprintf("ipBlock %s, an address of node i1 (%s)", host6, e.CIDRIdentity(v6)); got != want {
		t.Errorf("DescribeIdentity = %q, want %q", got, want)
	}
	e.SetNode("i1", map[string]string{"role": "infra"}, []netip.Addr{v4, v6})
	if ch := e.TakeChanges(); !ch.Empty() {
		t.Errorf("the same node again changed %+v", ch)
	}
	// w1 shares the address: relabeled infra, then i1 leaves; the prefix
	// stays while one selected node has it.
	e.SetNode("w1", map[string]string{"role": "infra"}, []netip.Addr{v4})
	e.SetNode("i1", map[string]string{"role": "worker"}, []netip.Addr{v4, v6})
	if !denied(v4) || denied(v6) {
		t.Errorf("after relabeling: denied %v %v, want true false", denied(v4), denied(v6))
	}
	e.DeleteNode("w1")
	if _, ok := e.PrefixIdentity(host4); ok || denied(v4) {
		t.Errorf("no node selected: prefix %s still known or %s denied", host4, v4)
	}
	if errs := e.TakeErrors(); len(errs) > 0 {
		t.Fatal(fmt.Sprint(errs))
	}
}

// BenchmarkEngineNodeRelabel is the engine's share of a node label change
// (one node moving between zones, each zone named by one nodes peer) with
// the 1,000 ClusterNetworkPolicies of the ADD benchmark loaded and 100
// or 5,000 nodes: the work should not grow with the node or policy count.
func BenchmarkEngineNodeRelabel(b *testing.B) {
	for _, nodes := range []int{100, 5000} {
		b.Run(fmt.Sprint(nodes, "-nodes"), func(b *testing.B) {
			e := NewEngine(identity.NewCIDRs())
			for i := range 50 {
				e.SetNamespace(fmt.Sprint("team-", i), map[string]string{"team": fmt.Sprint("t", i)})
				e.AddLocal(identity.Identity{ID: identity.FirstPod + identity.ID(i), Namespace: fmt.Sprint("team-", i)})
			}
			for _, p := range benchClusterPolicies(b, 1000) {
				e.UpsertPolicy(p)
			}
			for z := range 10 {
				cnp := &cnpv1beta1.ClusterNetworkPolicy{}
				doc := fmt.Sprintf("metadata: {name: zone%d}\nspec: {tier: Admin, priority: %d, subject: {namespaces: {}},"+
					" egress: [{action: Deny, to: [{nodes: {matchLabels: {zone: z%d}}}]}]}", z, z, z)
				if err := yaml.UnmarshalStrict([]byte(doc), cnp); err != nil {
					b.Fatal(err)
				}
				p, err := policyir.NormalizeCluster(cnp)
				if err != nil {
					b.Fatal(err)
				}
				e.UpsertPolicy(p)
			}
			addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)}) }
			for i := range nodes {
				e.SetNode(fmt.Sprint("n", i), map[string]string{"zone": fmt.Sprint("z", i%10)}, []netip.Addr{addr(i)})
			}
			e.TakeChanges()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				e.SetNode("n0", map[string]string{"zone": fmt.Sprint("z", 1+i%9)}, []netip.Addr{addr(0)})
				e.TakeChanges()
			}
		})
	}
}
