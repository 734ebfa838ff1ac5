package daemon

import (
	"io"
	"net/netip"
	"slices"
	"testing"

	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/masquerade"
	"github.com/coordino/coordino/daemon/peers"
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func has(ps []netip.Prefix, s string) bool { return slices.Contains(ps, netip.MustParsePrefix(s)) }

// TestMasqueradeConfig: what the feeder asks the table for. Sources are
// every node's blocks, the node's own CIDRs and the pools with natOutgoing;
// the exempt pools are sources never masqueraded; the cluster (never a
// masqueraded destination) is all of those with node addresses, the flag's
// and the API's Service ranges and the non-masquerade CIDRs.
func TestMasqueradeConfig(t *testing.T) {
	o, err := config.Parse([]string{"--standalone", "--pod-cidr", "10.1.0.0/24", "--service-cidrs", "10.96.0.0/16",
		"--non-masquerade-cidrs", "172.16.0.0/12"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	m := &masq{o: o, log: zap.NewNop()}
	m.peers = peers.Set{"n2": &peers.Node{Name: "n2", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2")},
		Blocks: prefixes("10.1.1.0/24", "fd00:1:1::/64")}}
	m.pools = poolNAT{nat: prefixes("10.1.0.0/16"), exempt: prefixes("10.50.0.0/16")}
	m.services = prefixes("10.200.0.0/16")
	c := m.config()
	for _, s := range []string{"10.1.0.0/24", "10.1.1.0/24", "fd00:1:1::/64", "10.1.0.0/16"} {
		if !has(c.Sources, s) || !has(c.Cluster, s) {
			t.Errorf("%s: a source %v, in the cluster %v; want both", s, has(c.Sources, s), has(c.Cluster, s))
		}
	}
	if has(c.Sources, "10.50.0.0/16") || !has(c.Exempt, "10.50.0.0/16") || !has(c.Cluster, "10.50.0.0/16") {
		t.Errorf("the natOutgoing-false pool: sources %v exempt %v cluster %v", c.Sources, c.Exempt, c.Cluster)
	}
	for _, s := range []string{"192.0.2.2/32", "2001:db8::2/128", "10.96.0.0/16", "10.200.0.0/16", "172.16.0.0/12"} {
		if !has(c.Cluster, s) {
			t.Errorf("cluster %v lacks %s", c.Cluster, s)
		}
	}
	if has(c.Cluster, "0.0.0.0/0") || len(c.Sources) == 0 {
		t.Errorf("config %+v", c)
	}
}

// TestMasqueradeWaitsForTheAPI: in Kubernetes mode nothing is written
// before the API's pools came (a natOutgoing-false pool would be
// masqueraded for a moment), and a daemon with --masquerade=false writes
// nothing at all.
func TestMasqueradeWaitsForTheAPI(t *testing.T) {
	o, err := config.Parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// A table in no namespace: every write fails, and shows as a problem.
	m := &masq{o: o, log: zap.NewNop(), table: &masquerade.Table{NetNS: -1}, waiting: true}
	m.setPeers(peers.Set{})
	if m.problem != "" {
		t.Fatalf("applied before the API's ranges: %s", m.problem)
	}
	m.setRanges(poolNAT{}, nil)
	if m.waiting || m.problem == "" {
		t.Fatalf("the API's ranges came: waiting %v, problem %q; want a write tried (and failed)", m.waiting, m.problem)
	}
	m.problem = ""
	o.Masquerade.Masquerade = false
	m.setPeers(peers.Set{})
	if m.problem != "" {
		t.Fatalf("--masquerade=false wrote: %s", m.problem)
	}
}

// TestMasqueradeChainedNetworks: the networks of chained attachments' pods
// are cluster destinations. The table is written when a network is first
// held and when its last attachment goes, not for each attachment; a
// network wider than the bound or holding a node's address gives only the
// pod's address.
func TestMasqueradeChainedNetworks(t *testing.T) {
	o, err := config.Parse([]string{"--standalone", "--pod-cidr", "10.1.0.0/24"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// A table in no namespace: every write fails, which shows it was tried.
	m := &masq{o: o, log: zap.NewNop(), table: &masquerade.Table{NetNS: -1}}
	m.peers = peers.Set{"n2": &peers.Node{Name: "n2", Addresses: []netip.Addr{netip.MustParseAddr("198.19.0.2")}}}
	wrote := func(what string, want bool) {
		t.Helper()
		if (m.problem != "") != want {
			t.Fatalf("%s: table written %v, want %v", what, m.problem != "", want)
		}
		m.problem = ""
	}
	cluster := func() []netip.Prefix { return m.config().Cluster }

	m.LearnChained("net/a/eth0", prefixes("198.18.22.5/24", "fd00:22::5/64"))
	wrote("first attachment of a network", true)
	m.LearnChained("net/b/eth0", prefixes("198.18.22.6/24"))
	wrote("second attachment of the same network", false)
	if c := cluster(); !has(c, "198.18.22.0/24") || !has(c, "fd00:22::/64") {
		t.Fatalf("cluster %v lacks the chained networks", c)
	}
	m.ForgetChained("net/a/eth0")
	wrote("one of two attachments gone (its IPv6 network with it)", true)
	if c := cluster(); !has(c, "198.18.22.0/24") || has(c, "fd00:22::/64") {
		t.Fatalf("cluster %v: want 198.18.22.0/24 kept, fd00:22::/64 gone", c)
	}
	m.ForgetChained("net/b/eth0")
	wrote("the last attachment gone", true)
	if c := cluster(); has(c, "198.18.22.0/24") {
		t.Fatalf("cluster %v keeps a network no attachment has", c)
	}

	// A /0, a network holding node n2's address, and n2's address itself.
	m.LearnChained("net/c/eth0", prefixes("198.18.22.7/0", "198.19.0.9/16", "198.19.0.2/32"))
	wrote("narrowed networks", true)
	if got, want := m.chained.networks(), prefixes("198.18.22.7/32", "198.19.0.9/32"); !slices.Equal(got, want) {
		t.Errorf("chained networks %v, want %v", got, want)
	}
	if c := cluster(); has(c, "0.0.0.0/0") || has(c, "198.19.0.0/16") {
		t.Errorf("cluster %v holds a chained network beyond the bound", c)
	}
}

// Learning an attachment again with the same networks writes nothing.
func TestMasqueradeChainedRelearn(t *testing.T) {
	o, err := config.Parse([]string{"--standalone", "--pod-cidr", "10.1.0.0/24"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	m := &masq{o: o, log: zap.NewNop(), table: &masquerade.Table{NetNS: -1}}
	m.LearnChained("net/a/eth0", prefixes("198.18.22.5/24"))
	m.problem = ""
	m.LearnChained("net/a/eth0", prefixes("198.18.22.5/24"))
	if m.problem != "" || !slices.Equal(m.chained.networks(), prefixes("198.18.22.0/24")) {
		t.Fatalf("relearnt: table written %v, networks %v", m.problem != "", m.chained.networks())
	}
	m.LearnChained("net/a/eth0", prefixes("198.18.23.5/24"))
	if m.problem == "" || !slices.Equal(m.chained.networks(), prefixes("198.18.23.0/24")) {
		t.Fatalf("learnt another network: table written %v, networks %v", m.problem != "", m.chained.networks())
	}
}
