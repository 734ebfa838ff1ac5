package datapath

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/coordino/coordino/daemon/datapath/internal/testnet"
)

// Service tests: an nftables DNAT rule in the node netns stands in for
// kube-proxy (test/services runs the real one): Service address svcIP
// port 8080 translates to pod b port 80 (TCP and UDP). The full matrix
// against kube-proxy is in test/services; these pin the datapath's part.

var (
	svcCIDR = netip.MustParsePrefix("10.96.0.0/16")
	svcIP   = netip.MustParseAddr("10.96.0.10")
)

// dnatToServer installs the DNAT rule; removed at cleanup.
func dnatToServer(t *testing.T) {
	t.Helper()
	table := fmt.Sprintf("cdotest%x", rand.Uint32())
	rules := fmt.Sprintf(`table ip %[1]s {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr %[2]s tcp dport 8080 dnat to %[3]s:80
		ip daddr %[2]s udp dport 8080 dnat to %[3]s:80
	}
}`, table, svcIP, podIPs["b"])
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "ip", table).Run() })
}

// expectService probes pod from → the Service on proto/8080.
func (c *cluster) expectService(allowed bool, from, proto string) {
	c.t.Helper()
	err := c.pods[from].Probe(proto, svcIP, 8080)
	if allowed && err != nil {
		c.t.Errorf("%s>service %s/8080: want allowed, got %v", from, proto, err)
	}
	if !allowed && err == nil {
		c.t.Errorf("%s>service %s/8080: want denied, but it passed", from, proto)
	}
}

// clientEgressTo isolates a's egress (app=client in default), allowing only
// peer on port 80 (the backend's port, not the Service's).
func clientEgressTo(peer string) string {
	return `
metadata: {name: client-egress, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress: [{to: [` + peer + `], ports: [{protocol: TCP, port: 80}, {protocol: UDP, port: 80}]}]`
}

// TestServiceDecidedOnBackend: egress policy is decided on the destination
// DNAT chose. Allowing the backend's pods lets the client reach the Service
// (the old datapath judged the Service address and dropped it); allowing
// the Service CIDR but not the backend denies it (the old one allowed it).
func TestServiceDecidedOnBackend(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, ServiceCIDRs: []netip.Prefix{svcCIDR}}, false)
	if err := c.dp.ServiceHookError(); err != nil {
		t.Fatalf("post-DNAT hook not attached: %v", err)
	}
	dnatToServer(t)
	c.expectService(true, "a", "tcp") // not isolated yet

	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}`))
	c.expectService(true, "a", "tcp")
	c.expectService(true, "a", "udp")
	c.expect(true, "a>b tcp/80")

	c.policies(clientEgressTo(`{ipBlock: {cidr: 10.96.0.0/16}}`))
	c.expectService(false, "a", "tcp")
	c.expectService(false, "a", "udp")
	c.expectService(true, "c", "tcp") // c's namespace has no policy
	if n := reasonCount(t, c, "policy-denied"); n == 0 {
		t.Error("no egress drop counted as policy-denied")
	}
}

// TestServiceFlowRevokedOnBackend: an open connection through a Service
// is cut when a policy change stops allowing its backend, and kept when
// the change still allows it.
func TestServiceFlowRevokedOnBackend(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, ServiceCIDRs: []netip.Prefix{svcCIDR}}, false)
	dnatToServer(t)
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}`))
	conn, err := c.pods["a"].Dial(svcIP, 8080)
	if err != nil {
		t.Fatalf("dial service: %v", err)
	}
	defer conn.Close()
	if err := testnet.Echo(conn); err != nil {
		t.Fatalf("echo: %v", err)
	}
	// Still allowed (another rule now): the connection keeps working.
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}, {ipBlock: {cidr: 203.0.113.0/24}}`))
	if err := testnet.Echo(conn); err != nil {
		t.Fatalf("echo after a change that still allows the backend: %v", err)
	}
	c.policies(clientEgressTo(`{ipBlock: {cidr: 10.96.0.0/16}}`))
	if err := testnet.Echo(conn); err == nil {
		t.Fatal("connection to a backend no longer allowed still works")
	}
	if n := reasonCount(t, c, "policy-revoked"); n == 0 {
		t.Error("no packet counted as policy-revoked")
	}
}

// TestServiceFailsClosedWithoutHook: without the post-DNAT hook (as on a
// kernel before 6.4), an egress-isolated pod's Service traffic is dropped
// even where its policy allows the backend, and counted with its reason.
func TestServiceFailsClosedWithoutHook(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, ServiceCIDRs: []netip.Prefix{svcCIDR}, NoServiceHook: true}, false)
	if c.dp.ServiceHookError() == nil {
		t.Fatal("hook reported attached although disabled")
	}
	dnatToServer(t)
	c.expectService(true, "a", "tcp") // not isolated: nothing to decide
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}, {ipBlock: {cidr: 10.96.0.0/16}}`))
	c.expectService(false, "a", "tcp")
	c.expect(true, "a>b tcp/80")
	if n := reasonCount(t, c, "service-unenforceable"); n == 0 {
		t.Error("no drop counted as service-unenforceable")
	}
}
