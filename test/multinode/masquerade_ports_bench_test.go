//go:build benchmultinode

package multinode

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/harness"
)

// natPorts is the kernel NAT's source port range for a masqueraded flow
// whose own source port is 1024 or above (nf_nat without a port range):
// 1024–65535.
const natPorts = 65535 - 1024 + 1

// TestBenchMasqueradePorts fills the masquerade's port range: two pods on
// one node send one UDP datagram from each of about 83,000 distinct source ports
// to one outside address and port, so every datagram is a flow that needs
// its own port of the node's address. It reports how many the node holds
// (its conntrack entries to that destination), against the range, what
// was refused (coordino_conntrack_failures_total{kind="insert_failed"}
// from the daemon's /metrics), and that a TCP connection opened before
// keeps working.
func TestBenchMasqueradePorts(t *testing.T) {
	c := newClusterWith(t, direct, 2, nil)
	o := newOutside(t, c)
	n := c.nodes[0]
	p1, p2 := c.addPod(n), c.addPod(n)
	dst := netip.AddrPortFrom(o.masq(false), whoPort+3)
	var sink net.PacketConn
	if err := o.ns.Do(func(ns.NetNS) (err error) {
		sink, err = net.ListenPacket("udp4", dst.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer sink.Close()

	established, err := harness.DialFrom(p1.NS, "tcp", o.masq(false), whoPort, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer established.Close()
	if got, err := ask(established); err != nil || got != n.address(false) {
		t.Fatalf("before: the outside host saw %v (%v), want %s", got, err, n.address(false))
	}
	before, err := n.Metric("coordino_conntrack_failures_total", `kind="insert_failed"`)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	sent := flood(t, p1.NS, dst, 1024, 65535) + flood(t, p2.NS, dst, 1024, 19512)
	took := time.Since(start)
	held := heldFlows(t, n.NS, dst)
	after, err := n.Metric("coordino_conntrack_failures_total", `kind="insert_failed"`)
	if err != nil {
		t.Fatal(err)
	}
	refused := after - before
	got, err := ask(established)
	if err != nil || got != n.address(false) {
		t.Errorf("the connection opened before the range filled: %v (%v)", got, err)
	}
	t.Logf("\n| flows opened (UDP, one destination) | held by the node | port range | refused (insert_failed) | established TCP connection |\n|---|---|---|---|---|\n| %d in %s | %d (%.1f%%) | %d | %.0f | %s |",
		sent, took.Round(time.Millisecond), held, 100*float64(held)/natPorts, natPorts, refused, map[bool]string{true: "kept", false: "LOST"}[err == nil])
	if held > natPorts {
		t.Errorf("held %d flows to one destination, more than the %d ports", held, natPorts)
	}
	if held < natPorts*95/100 {
		t.Errorf("held %d flows, under 95%% of the %d ports", held, natPorts)
	}
	if int(refused) < sent-natPorts-sent/100 {
		t.Errorf("refused %.0f of %d flows beyond the %d ports: exhaustion not counted", refused, sent, natPorts)
	}
}

// flood sends one datagram to dst from each source port lo..hi inside the
// netns, returning how many it sent.
func flood(t *testing.T, n ns.NetNS, dst netip.AddrPort, lo, hi int) int {
	t.Helper()
	sent := 0
	to := &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	err := n.Do(func(ns.NetNS) error {
		for port := lo; port <= hi; port++ {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			err = unix.Bind(fd, &unix.SockaddrInet4{Port: port})
			if err == nil {
				err = unix.Sendto(fd, []byte{1}, 0, to)
			}
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("port %d: %w", port, err)
			}
			sent++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sent
}

// heldFlows counts the node's conntrack entries to dst (what the NAT
// translated and conntrack confirmed).
func heldFlows(t *testing.T, n ns.NetNS, dst netip.AddrPort) int {
	t.Helper()
	held := 0
	err := n.Do(func(ns.NetNS) error {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		if err != nil {
			return err
		}
		for _, f := range flows {
			a, _ := netip.AddrFromSlice(f.Forward.DstIP.To4())
			if f.Forward.Protocol == unix.IPPROTO_UDP && a == dst.Addr() && f.Forward.DstPort == dst.Port() {
				held++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("conntrack dump: %v", err)
	}
	return held
}
