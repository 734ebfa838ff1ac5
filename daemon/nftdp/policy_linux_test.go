package nftdp

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/test/privileged"
)

func TestDefaultAllowThenIsolation(t *testing.T) {
	c := newCluster(t, false)
	c.expect(true, "a>b tcp/80", "c>b udp/81", "ext>b tcp/80", "node>b tcp/80", "b>ext tcp/80")
	c.policies(policyDoc("server", "default", `  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 80}]
`))
	c.expect(true, "a>b tcp/80", "node>b tcp/81", "b>a tcp/80", "b>ext tcp/81")
	c.expect(false, "a>b tcp/81", "a>b udp/80", "c>b tcp/80", "ext>b tcp/80")
	c.policies()
	c.expect(true, "a>b tcp/81", "c>b tcp/80")
}

// TestRewriteCreatesNoChain: a policy change that rewrites a pair's chain
// and an endpoint's chains flushes and refills them; it never adds an
// existing chain again, which the kernel takes tens of milliseconds to
// commit (every attach and policy change paid it).
func TestRewriteCreatesNoChain(t *testing.T) {
	c := newCluster(t, false)
	allow := func(port int) string {
		return policyDoc("server", "default", fmt.Sprintf(`  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: %d}]
`, port))
	}
	c.policies(allow(80))
	if c.dp.stats.lastChainAdds == 0 {
		t.Fatal("the first policy created no chain")
	}
	c.policies(allow(81)) // the pair's chain rewritten
	if ops, adds := c.dp.stats.lastOps, c.dp.stats.lastChainAdds; ops == 0 || adds != 0 {
		t.Errorf("port change: %d changes, %d chains added, want some and none", ops, adds)
	}
	c.policies() // b no longer isolated: its endpoint chains rewritten
	if ops, adds := c.dp.stats.lastOps, c.dp.stats.lastChainAdds; ops == 0 || adds != 0 {
		t.Errorf("isolation change: %d changes, %d chains added, want some and none", ops, adds)
	}
	c.expect(true, "a>b tcp/80", "c>b tcp/81")
}

// TestManyPortsOneLookup: a pair allowing many ports is one set lookup
// (and its few port ranges a rule each), not a rule per port that every
// packet of a connection's opening direction would walk; the set reads
// back with nft.
func TestManyPortsOneLookup(t *testing.T) {
	c := newCluster(t, false)
	var ports []string
	for p := 80; p < 80+2*300; p += 2 { // 80, 82, ...: no two merge
		ports = append(ports, fmt.Sprintf("{port: %d}", p))
	}
	c.policies(policyDoc("server", "default", fmt.Sprintf(`  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [%s, {protocol: UDP, port: 53}, {port: 5000, endPort: 5010}, {protocol: UDP, port: 6000, endPort: 6010}]
`, strings.Join(ports, ", "))))
	c.expect(true, "a>b tcp/80")
	c.expect(false, "a>b tcp/81", "a>b udp/80", "c>b tcp/80")
	chains, err := c.dp.conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	pairs := 0
	for _, ch := range chains {
		g, ok := parsePairChain(ch.Name)
		if ch.Table.Name != TableName || !ok || g.remote == identity.Any {
			continue
		}
		pairs++
		rules, err := c.dp.conn.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		if len(rules) != 3 {
			t.Errorf("chain %s has %d rules for 301 ports and 2 ranges, want 3", ch.Name, len(rules))
		}
	}
	if pairs != 1 {
		t.Errorf("%d pair chains, want 1", pairs)
	}
	// Many ranges: one interval set.
	c.policies(policyDoc("server", "default", `  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 70, endPort: 72}, {port: 74, endPort: 76}, {port: 78, endPort: 80}, {port: 90, endPort: 92},
      {port: 94, endPort: 96}, {port: 98, endPort: 99}]
`))
	c.expect(true, "a>b tcp/80")
	c.expect(false, "a>b tcp/81", "c>b tcp/80")
	if _, err := exec.LookPath("nft"); err != nil {
		privileged.Needs(t, "nft (Debian package nftables) to read the table back")
	}
	out, err := exec.Command("nft", "list", "table", "inet", TableName).CombinedOutput()
	if err != nil || strings.Contains(string(out), "invalid") || !strings.Contains(string(out), "meta l4proto . th dport { tcp . 70-72, ") {
		t.Errorf("nft list table: %v\n%s", err, out)
	}
}

// TestUnselectedPodsHaveNoMaps: an identity's verdict maps and chains are
// made when a policy selects it (its chains look peers up in them), not
// at every attach of a new label set: eight sets and two chains less in
// the ADD's transaction.
func TestUnselectedPodsHaveNoMaps(t *testing.T) {
	c := newCluster(t, false)
	ids := c.dp.LocalIdentities()
	mapsOf := func(id identity.ID) int {
		sets, err := c.dp.conn.GetSets(c.dp.lay.table)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range sets {
			if local, _, _, _, ok := parseLocalSet(s.Name); ok && local == id {
				n++
			}
		}
		return n
	}
	for name, id := range map[string]identity.ID{"a": ids[c.eps["a"].Key], "b": ids[c.eps["b"].Key]} {
		if n := mapsOf(id); n != 0 {
			t.Errorf("%s, selected by no policy, has %d verdict maps", name, n)
		}
	}
	c.policies(serverFromClientsOn80)
	if n := mapsOf(ids[c.eps["b"].Key]); n != 8 {
		t.Errorf("b, isolated, has %d verdict maps, want 8", n)
	}
	c.expect(true, "a>b tcp/80")
	c.expect(false, "c>b tcp/80")
	c.policies()
	c.expect(true, "c>b tcp/80")
}
