package nftdp

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/coordino/coordino/test/privileged"
)

// TestTableListsWithNft: operators and other tools read the ruleset with
// nft; every rule and element of the table must read back (nft aborts on
// expressions it cannot represent, e.g. a map's result used as a key).
func TestTableListsWithNft(t *testing.T) {
	c := newCluster(t, true)
	c.policies(policyDoc("server", "default", `  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}, {ipBlock: {cidr: 203.0.0.0/8, except: [203.0.113.0/24]}}]
    ports: [{port: 80}, {port: 1000, endPort: 1100}, {protocol: UDP}]
  - from: [{ipBlock: {cidr: "2001:db8::/32"}}]
  egress:
  - to: [{namespaceSelector: {}}]
  - ports: [{port: 53, protocol: UDP}]
  policyTypes: [Ingress, Egress]
`))
	if _, err := exec.LookPath("nft"); err != nil {
		privileged.Needs(t, "nft (Debian package nftables) to read the table back")
	}
	out, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset: %v\n%s", err, out)
	}
	for _, want := range []string{"table inet " + TableName, "ip saddr vmap @pods4-", "ip daddr . meta l4proto vmap @cidrs4-",
		"iifname . ip saddr != @src4", "tcp dport 1000-1100 accept", "203.0.0.0-203.0.112.255"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("ruleset lacks %q", want)
		}
	}
	if strings.Contains(string(out), "invalid") {
		t.Errorf("nft reads part of the table as invalid")
	}
	if t.Failed() {
		t.Logf("%s", out)
	}
}
