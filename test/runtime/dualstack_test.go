package runtime

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/coordino/coordino/test/testbed"
)

// TestCRIDualStack: a daemon with an IPv4 and an IPv6 pod CIDR gives every
// sandbox one address of each, both reachable from the host, and frees both.
func TestCRIDualStack(t *testing.T) {
	gate(t, false)
	ctx := context.Background()
	b := newBed(t, ctx, false)
	d := startDaemon(t, ctx, b, testbed.CoordinoCIDR4, testbed.CoordinoCIDR6)
	base := usedBaseline(t, d)
	if err := b.WriteConflist(testbed.HandlerPrimary, testbed.NetPrimary, []map[string]any{testbed.CoordinoPlugin(d.RunDir)}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	pod := sandboxConfig(t, dir, "dual")
	id, ip4, _ := runp(t, b, testbed.HandlerPrimary, pod)
	out, err := b.Crictl("inspectp", "-o", "go-template", "--template", "{{range .status.network.additionalIps}}{{.ip}} {{end}}", id)
	if err != nil {
		t.Fatal(err)
	}
	var ip6 netip.Addr
	for _, f := range strings.Fields(out) {
		if a, err := netip.ParseAddr(f); err == nil && a.Is6() {
			ip6 = a
		}
	}
	if !netip.MustParsePrefix(testbed.CoordinoCIDR4).Contains(ip4) || !netip.MustParsePrefix(testbed.CoordinoCIDR6).Contains(ip6) {
		t.Fatalf("sandbox addresses %s, %q: want one in %s and one in %s", ip4, out, testbed.CoordinoCIDR4, testbed.CoordinoCIDR6)
	}
	cid, err := b.Crictl("create", "--no-pull", id, probeContainerConfig(t, dir), pod)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Crictl("start", cid); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []netip.Addr{ip4, ip6} {
		for _, network := range []string{"tcp", "udp"} {
			if err := echo(network, net.JoinHostPort(ip.String(), "8080")); err != nil {
				t.Errorf("host -> pod %s %s: %v", network, ip, err)
			}
		}
	}
	// One sandbox, two addresses, one pin.
	if used, err := d.UsedAddresses(); err != nil || used != base+2 {
		t.Errorf("daemon has %v addresses in use (%v), want %v", used, err, base+2)
	}
	if p := d.NetnsPins(); len(p) != 1 {
		t.Errorf("daemon netns pins %v, want 1", p)
	}
	stopRemove(t, b, id)
	assertNoRuntimeLeaks(t, b, testbed.NetPrimary, false)
	assertNoDaemonLeaks(t, d, testbed.NetPrimary, base)
}
