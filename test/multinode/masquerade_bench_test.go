//go:build benchmultinode

package multinode

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/coordino/coordino/test/harness"
)

// TestBenchMasquerade measures pod → outside host through the masquerade
// against the same pod to the same host with the pod CIDR routed (the
// outside host's non-masquerade address, routed back to the pods): TCP
// throughput (1 stream) and the rate of new connections, where the NAT's
// cost lies (a conntrack entry and a port per connection).
func TestBenchMasquerade(t *testing.T) {
	var o *outside
	c := newClusterWith(t, direct, 2, func(string) []string { return nonMasqueradeArgs(o) })
	o = newOutside(t, c)
	p := c.addPod(c.nodes[0])
	if got, err := seenFrom(p, "tcp", o.masq(false)); err != nil || got != c.nodes[0].address(false) {
		t.Fatalf("masqueraded path: seen as %v (%v)", got, err)
	}
	var rows []string
	row := func(test, unit string, prec int, r pairs) {
		rows = append(rows, fmt.Sprintf("| %s | %.*f %s | %.*f %s | %.2f× | %.2f–%.2f× |", test, prec, r.got, unit, prec, r.ref, unit, r.ratio, r.ratioLo, r.ratioHi))
	}
	r := interleaved(func() float64 { return iperf(t, p.NS, o.ns, o.masq(false), 1) / 1e9 },
		func() float64 { return iperf(t, p.NS, o.ns, o.direct(false), 1) / 1e9 })
	row("TCP 1 stream", "Gbit/s", 2, r)
	r = interleaved(func() float64 { return connRate(t, p.NS, o.ns, o.masq(false)) },
		func() float64 { return connRate(t, p.NS, o.ns, o.direct(false)) })
	row("new TCP connections (connect, 1-byte echo, close)", "/s", 0, r)
	t.Logf("\n%d interleaved rounds, iperf3 %d s and connections for %v per round; medians and the per-round ratios' range\n| test | masqueraded | routed pod CIDR | ratio | ratio min–max |\n|---|---|---|---|---|\n%s",
		benchRounds(), benchSeconds(), requestWindow, joinLines(rows))
}

// connRate is the rate of new TCP connections from one netns to an echo
// server on addr in another, each exchanging one byte, over requestWindow.
func connRate(t *testing.T, from, to ns.NetNS, addr netip.Addr) float64 {
	t.Helper()
	stop, err := harness.ServeTCPEcho(to, addr, echoPort+2)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	n, start := 0, time.Now()
	b := []byte{1}
	for time.Since(start) < requestWindow {
		conn, err := harness.DialFrom(from, "tcp", addr, echoPort+2, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err = conn.Write(b); err == nil {
			_, err = conn.Read(b)
		}
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds()
}
