package nftdp

import (
	"fmt"
	"testing"
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
