package datapath

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// listenUDP opens a UDP socket inside pod p on addr and returns a function
// reporting whether a datagram arrives within testnet.Timeout.
func listenUDP(t *testing.T, p *testnet.Pod, addr netip.AddrPort) func() bool {
	t.Helper()
	var pc net.PacketConn
	if err := p.Do(func() (err error) { pc, err = net.ListenPacket("udp", addr.String()); return err }); err != nil {
		t.Fatalf("listen in %s: %v", p.Name, err)
	}
	t.Cleanup(func() { pc.Close() })
	return func() bool {
		_ = pc.SetReadDeadline(time.Now().Add(testnet.Timeout))
		_, _, err := pc.ReadFrom(make([]byte, 2048))
		return err == nil
	}
}

// TestForgedNodeIPv6Dropped reproduces the reported bypass: a pod under
// default-deny ingress received IPv6 UDP from a neighbour pod that forged
// the node's IPv6 address (the host identity, always allowed in). Fails on
// the code before source validation.
func TestForgedNodeIPv6Dropped(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC}, true)
	c.policies(denyServerIngress)
	target := netip.AddrPortFrom(podIPs6["b"], 9999)
	received := listenUDP(t, c.pods["b"], target)

	// Control: the node itself reaches b over IPv6.
	send := func(from netip.Addr) error {
		conn, err := net.DialUDP("udp6", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 0)), net.UDPAddrFromAddrPort(target))
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte("hello"))
		return err
	}
	// A fresh interface may still be settling: allow a few tries.
	for try := 0; ; try++ {
		if err := send(testnet.NodeIP6); err != nil {
			t.Fatal(err)
		}
		if received() {
			break
		}
		if try == 4 {
			t.Fatal("control: the node's own IPv6 datagram did not reach b")
		}
	}

	// Pod a takes the node's address and sends from it.
	a := c.pods["a"]
	err := a.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: testnet.NodeIP6.AsSlice(), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Do(func() error { return send(testnet.NodeIP6) }); err != nil {
		t.Fatal(err)
	}
	if received() {
		t.Fatal("b (default-deny ingress) received IPv6 UDP from a pod forging the node's address")
	}
}

// TestLargeUDPReplyToIsolatedPod: a small query gets a reply bigger than
// the MTU (DNS with EDNS, Kerberos), which reaches the querying pod whose
// ingress is isolated. Fails on the old code, which dropped the reply's
// later fragments (port 0, no conntrack entry).
func TestLargeUDPReplyToIsolatedPod(t *testing.T) {
	c := newCluster(t, AttachTC)
	c.policies(clientDenyIngress)
	const port, size = 5300, 3000
	var server net.PacketConn
	err := c.pods["b"].Do(func() (err error) {
		server, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := server.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = server.WriteTo(bytes.Repeat([]byte("r"), size), from)
		}
	}()
	err = c.pods["a"].Do(func() error {
		conn, err := net.Dial("udp4", netip.AddrPortFrom(podIPs["b"], port).String())
		if err != nil {
			return err
		}
		defer conn.Close()
		for try := 0; ; try++ {
			if _, err := conn.Write([]byte("query")); err != nil {
				return err
			}
			_ = conn.SetReadDeadline(time.Now().Add(testnet.Timeout))
			buf := make([]byte, 2*size)
			n, err := conn.Read(buf)
			if err == nil && n == size {
				return nil
			}
			if try == 2 {
				return fmt.Errorf("no %d-byte reply: read %d bytes, %v", size, n, err)
			}
		}
	})
	if err != nil {
		t.Fatalf("fragmented UDP reply to an ingress-isolated pod: %v", err)
	}
}

// clearConntrack deletes every conntrack entry, as eviction would.
func clearConntrack(t *testing.T, c *cluster) {
	t.Helper()
	var (
		k    bpf.CoordinoCtKey
		v    bpf.CoordinoCtEntry
		keys []bpf.CoordinoCtKey
	)
	it := c.dp.objs.CdoConntrack.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	for i := range keys {
		_ = c.dp.objs.CdoConntrack.Delete(&keys[i])
	}
	if len(keys) == 0 {
		t.Fatal("no conntrack entries to clear")
	}
}

// TestLostConntrackEntryKeepsConnection: once a flow's entry is gone, the
// next allowed packet re-creates it, so replies to an ingress-isolated pod
// keep flowing. Fails on the old code, where only a SYN created entries.
func TestLostConntrackEntryKeepsConnection(t *testing.T) {
	c := newCluster(t, AttachTC)
	c.policies(clientDenyIngress)
	conn, err := c.pods["a"].Dial(podIPs["b"], 80)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := testnet.Echo(conn); err != nil {
		t.Fatal(err)
	}
	clearConntrack(t, c)
	if err := testnet.Echo(conn); err != nil {
		t.Fatalf("connection broke after its conntrack entry was lost: %v", err)
	}
}

func gauge(t *testing.T, c *cluster, name string, labels ...string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c.dp.Collectors()...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.Metric {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.Label {
					found = found || (l.GetName() == labels[i] && l.GetValue() == labels[i+1])
				}
				if !found {
					continue metric
				}
			}
			if m.Gauge != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s %v not exported", name, labels)
	return 0
}

// TestConntrackFloodEvictsWithoutBreakingFlows: a small table holding
// fewer entries than the pod has connections, then flooded with new flows,
// evicts entries; every connection keeps working (its next allowed packet
// re-creates its entry), the table stays within its capacity and the
// pressure shows in the metrics. On the old code (fixed 2^18 entries, SYN
// only) the evicted connections' replies were dropped for good.
func TestConntrackFloodEvictsWithoutBreakingFlows(t *testing.T) {
	const size, conns, flood = 64, 160, 4000
	c := newClusterWith(t, Config{AttachMode: AttachTC, ConntrackSize: size}, false)
	c.policies(clientDenyIngress)
	var open []net.Conn
	defer func() {
		for _, conn := range open {
			conn.Close()
		}
	}()
	for range conns {
		conn, err := c.pods["a"].Dial(podIPs["b"], 80)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, conn)
		if err := testnet.Echo(conn); err != nil {
			t.Fatal(err)
		}
	}
	created := gauge(t, c, "coordino_conntrack_events_total", "event", "created")
	err := c.pods["a"].Do(func() error {
		pc, err := net.ListenPacket("udp4", ":0")
		if err != nil {
			return err
		}
		defer pc.Close()
		for i := range flood {
			dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(podIPs["b"], uint16(10000+i)))
			if _, err := pc.WriteTo([]byte("churn"), dst); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := gauge(t, c, "coordino_conntrack_events_total", "event", "created") - created; got < flood {
		t.Fatalf("%v entries created by %d new flows", got, flood)
	}
	if n := gauge(t, c, "coordino_conntrack_entries"); n > size {
		t.Fatalf("%v entries in a table of %d", n, size)
	}
	if capacity := gauge(t, c, "coordino_conntrack_capacity"); capacity != size {
		t.Fatalf("capacity %v, want %d", capacity, size)
	}
	for i, conn := range open {
		if err := testnet.Echo(conn); err != nil {
			t.Fatalf("connection %d of %d broke under conntrack pressure: %v", i, conns, err)
		}
	}
	if p := gauge(t, c, "coordino_conntrack_events_total", "event", "pickup"); p < conns-size {
		t.Errorf("%v pickups, want at least %d evicted connections re-created", p, conns-size)
	}
}

// TestDropEventsRateLimited: a flood of denied datagrams yields a bounded
// number of drop events; every packet is still counted, and each one is
// either reported, suppressed or lost. Fails on the old code, which
// reported every dropped packet.
func TestDropEventsRateLimited(t *testing.T) {
	const flood = 20000
	c := newCluster(t, AttachTC)
	c.policies(denyServerIngress)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan Flow, flood)
	go func() {
		_ = c.dp.ReadFlows(ctx, func(f Flow) {
			if f.Verdict == "dropped" && f.Src == podIPs["a"] && f.Dst == podIPs["b"] {
				events <- f
			}
		})
	}()
	denied := func() float64 { return reasonCount(t, c, "policy-denied") }
	other := func() float64 {
		return gauge(t, c, "coordino_flow_events_suppressed_total") + gauge(t, c, "coordino_flow_events_lost_total")
	}
	denied0, other0 := denied(), other()
	start := time.Now()
	err := c.pods["a"].Do(func() error {
		conn, err := net.Dial("udp4", netip.AddrPortFrom(podIPs["b"], 80).String())
		if err != nil {
			return err
		}
		defer conn.Close()
		for range flood {
			if _, err := conn.Write([]byte("flood")); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	time.Sleep(500 * time.Millisecond) // the reader polls every 100 ms
	dropped, unreported := denied()-denied0, other()-other0
	reported := float64(len(events))
	t.Logf("%v dropped in %v: %v reported, %v suppressed or lost", dropped, elapsed.Round(time.Millisecond), reported, unreported)
	if dropped == 0 || dropped != reported+unreported {
		t.Fatalf("%v dropped != %v reported + %v suppressed or lost", dropped, reported, unreported)
	}
	if reported > dropped/4 {
		t.Fatalf("%v of %v drops reported: not rate-limited", reported, dropped)
	}
	if reported == 0 {
		t.Fatal("no drop reported at all")
	}
}

// TestDetachPurgesPeersFlowsOfItsAddresses: a deleted pod's address must not
// stay in the flows other endpoints track, or the next pod given that
// address would inherit them. DEL leaves them to the background purge
// (ctpurge.go), which this waits for.
func TestDetachPurgesPeersFlowsOfItsAddresses(t *testing.T) {
	c := newCluster(t, AttachTC)
	c.policies(clientDenyIngress) // a is isolated: its flows are tracked
	conn, err := c.pods["a"].Dial(podIPs["b"], 80)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := testnet.Echo(conn); err != nil {
		t.Fatal(err)
	}
	naming := func(ip netip.Addr) (n int) {
		_, want := packetAddr(ip)
		var (
			k bpf.CoordinoCtKey
			v bpf.CoordinoCtEntry
		)
		it := c.dp.objs.CdoConntrack.Iterate()
		for it.Next(&k, &v) {
			if k.Src == want || k.Dst == want {
				n++
			}
		}
		return n
	}
	if naming(podIPs["b"]) == 0 {
		t.Fatal("no tracked flow names b: the test tracks nothing")
	}
	if err := c.dp.DetachEndpoint(c.eps["b"]); err != nil {
		t.Fatal(err)
	}
	waitPurged(t, c.dp)
	if n := naming(podIPs["b"]); n != 0 {
		t.Fatalf("%d conntrack entries still name the detached pod's address", n)
	}
}
