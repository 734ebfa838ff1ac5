package cluster

import (
	"net/netip"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/bgp"
)

// TestRacksAddressPlan: with routing bgp the workers alternate between two
// subnets, and rack 0's machines reach rack 1 through the router; without
// it every worker stays on the one segment.
func TestRacksAddressPlan(t *testing.T) {
	flat := &Cluster{Options: Options{Workers: 3}}
	for i := 1; i <= 3; i++ {
		if got := flat.workerIP(i); !netip.MustParsePrefix(UnderlayCIDR).Contains(got) || flat.nodeGateway(i) != got {
			t.Errorf("one segment: worker-%d at %s via %s", i, got, flat.nodeGateway(i))
		}
	}
	racks := &Cluster{Options: Options{Workers: 3, Routing: "bgp"}}
	want := map[int][2]string{1: {"10.233.0.11", "10.233.0.11"}, 2: {"10.233.1.12", "10.233.0.1"}, 3: {"10.233.0.13", "10.233.0.13"}}
	for i, w := range want {
		if got, gw := racks.workerIP(i), racks.nodeGateway(i); got.String() != w[0] || gw.String() != w[1] {
			t.Errorf("racks: worker-%d at %s via %s, want %s via %s", i, got, gw, w[0], w[1])
		}
	}
	if err := checkRouting("ospf"); err == nil || !strings.Contains(err.Error(), "Routing") {
		t.Errorf("checkRouting(ospf) = %v, want an error naming Routing", err)
	}
}

// TestRacksBGPConfiguration: every worker is the router's neighbour in its
// rack's AS, and the bed's BGPPeerPolicies are valid specs that give each
// worker (by the zone its kubelet sets) the router of its own rack.
func TestRacksBGPConfiguration(t *testing.T) {
	c := &Cluster{Options: Options{Workers: 3, Routing: "bgp", Dir: "/run/x"}}
	frr := c.frrConfig()
	for _, line := range []string{"router bgp 65000", " neighbor 10.233.0.11 remote-as 64601", " neighbor 10.233.1.12 remote-as 64602",
		" neighbor 10.233.0.13 remote-as 64601", "  neighbor 10.233.1.12 activate", "  neighbor 10.233.0.13 as-override"} {
		if !strings.Contains(frr, line+"\n") {
			t.Errorf("FRR config lacks %q:\n%s", line, frr)
		}
	}
	var pols []coordinov1alpha1.BGPPeerPolicy
	for _, doc := range strings.Split(c.bgpPolicies(), "---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var p coordinov1alpha1.BGPPeerPolicy
		if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
			t.Fatalf("%v:\n%s", err, doc)
		}
		cfg, err := bgp.FromSpec(p.Spec, nil)
		if err != nil {
			t.Fatalf("BGPPeerPolicy %s: %v", p.Name, err)
		}
		if cfg.Services == nil || !cfg.Services.Matches(labels.Set{AnnounceLabel: "true"}) {
			t.Errorf("BGPPeerPolicy %s: serviceSelector %v does not select %s=true", p.Name, cfg.Services, AnnounceLabel)
		}
		pols = append(pols, p)
	}
	for i := 1; i <= 3; i++ {
		p, ignored := bgp.Select(pols, map[string]string{ZoneLabel: rackName(c.rackOf(i))})
		if p == nil || len(ignored) > 0 {
			t.Fatalf("worker-%d: policy %v, ignored %v", i, p, ignored)
		}
		if p.Spec.Peers[0].Address != routerIP(c.rackOf(i)).String() || p.Spec.LocalASN != int64(rackASN+c.rackOf(i)) {
			t.Errorf("worker-%d: peers %+v AS %d", i, p.Spec.Peers, p.Spec.LocalASN)
		}
	}
}

// TestRouterTableMissingBlocks: a worker counts as announced only by a
// valid route inside its pool whose next hop is the worker.
func TestRouterTableMissingBlocks(t *testing.T) {
	c := &Cluster{Options: Options{Workers: 2, Routing: "bgp"}}
	tbl, err := parseRouterTable([]byte(`{"routes":{
		"10.234.1.0/26":[{"valid":true,"nexthops":[{"ip":"10.233.0.11"}]}],
		"10.234.2.0/26":[{"valid":false,"nexthops":[{"ip":"10.233.1.12"}]}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if m := c.missingBlocks(tbl); len(m) != 1 || !strings.HasPrefix(m[0], "worker-2") {
		t.Errorf("missing = %v, want worker-2 only (its route is not valid)", m)
	}
	tbl[netip.MustParsePrefix("10.234.2.0/26")] = netip.MustParseAddr("10.233.1.12")
	if m := c.missingBlocks(tbl); len(m) != 0 {
		t.Errorf("missing = %v, want none", m)
	}
	if _, err := parseRouterTable([]byte(`{"routes":{"nope":[]}}`)); err == nil {
		t.Error("a bad prefix parsed")
	}
}
