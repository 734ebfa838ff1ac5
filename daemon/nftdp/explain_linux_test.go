package nftdp

import (
	"slices"
	"testing"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// TestExplainNamesTheDecidingRule: explain's decision at an endpoint
// agrees with the traffic and names the policy and rule, as in eBPF mode.
func TestExplainNamesTheDecidingRule(t *testing.T) {
	c := newCluster(t, false)
	c.policies(serverFromClientsOn80)
	c.expect(true, "a>b tcp/80")
	c.expect(false, "c>b tcp/80")
	ids := c.dp.LocalIdentities()
	b := c.eps["b"]
	for _, tc := range []struct {
		from    string
		allowed bool
		reason  string
		by      []string
	}{
		{"a", true, "policy", []string{"default/server spec.ingress[0]"}},
		{"c", false, "policy-denied", nil},
	} {
		dec, err := c.dp.Decide(b.HostIfIndex, policy.Ingress, podIPs[tc.from], policy.ProtoTCP, 80)
		if err != nil {
			t.Fatal(err)
		}
		if dec.Allowed() != tc.allowed || dec.Reason != tc.reason || dec.Local != ids[b.Key] || dec.Remote != ids[c.eps[tc.from].Key] {
			t.Errorf("%s>b: decision %+v", tc.from, dec)
		}
		selected, allowed := c.dp.Provenance(dec, policy.Ingress, podIPs[tc.from], policy.ProtoTCP, 80)
		if !slices.Equal(selected, []string{"default/server"}) || !slices.Equal(allowed, tc.by) {
			t.Errorf("%s>b: selected by %v, allowed by %v; want [default/server], %v", tc.from, selected, allowed, tc.by)
		}
	}
	// Egress of a is open; the world is the world.
	dec, err := c.dp.Decide(c.eps["a"].HostIfIndex, policy.Egress, podIPs["ext"], policy.ProtoTCP, 80)
	if err != nil || !dec.Allowed() || dec.Reason != "not-isolated" || dec.Remote != identity.World {
		t.Errorf("a>ext: %+v, %v", dec, err)
	}
	if got := c.dp.DescribeIdentity(ids[b.Key]); got != "pods in namespace default with labels app=server" {
		t.Errorf("DescribeIdentity: %q", got)
	}
	states := c.dp.EndpointStates()
	i := slices.IndexFunc(states, func(s datapath.EndpointState) bool { return s.Key == b.Key })
	if i < 0 || !states[i].Isolation.Has(policy.Ingress) || states[i].Mode != "nftables" {
		t.Errorf("endpoint states %+v", states)
	}
}
