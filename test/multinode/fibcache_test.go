package multinode

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/bpf"
)

// TestHostRoutingFollowsRouteChanges: host routing's programs remember the
// FIB's answer per flow (cdo_fib_cache), and a route change still moves a
// flow at once. A blackhole route for b's address, added on a's node under
// a steady host-routed UDP stream, stops the stream within the daemon's
// reading of one netlink notification (the cache alone would have kept it
// flowing for up to a second), three times over; removed, the stream comes
// back. With the daemon stopped, the cache's expiry alone still honours the
// change within a second. A cached answer still checks each packet against
// the egress MTU.
func TestHostRoutingFollowsRouteChanges(t *testing.T) {
	c := newCluster(t, direct, 2)
	a, b := c.addPod(c.nodes[0]), c.addPod(c.nodes[1])
	s := startUDPStream(t, a, b, echoPort+7)
	blackhole := &netlink.Route{Dst: ipNet(netip.PrefixFrom(b.addr(false), 32)), Type: unix.RTN_BLACKHOLE}
	route := func(add bool) {
		t.Helper()
		if err := c.nodes[0].NS.Do(func(ns.NetNS) error {
			if add {
				return netlink.RouteAdd(blackhole)
			}
			return netlink.RouteDel(blackhole)
		}); err != nil {
			t.Fatal(err)
		}
	}

	// Flowing, and host-routed: the answers come from the cache.
	before := hostRouteStats(t, c.nodes[0])
	s.expectFlowing(t, "before the route change")
	if got := statDelta(before, hostRouteStats(t, c.nodes[0]), bpf.CoordinoHostrouteStatHR_STAT_OUT_REDIRECTED); got < 20 {
		t.Fatalf("host routing redirected %d of the stream's datagrams, want >= 20", got)
	}

	change := func(t *testing.T, within time.Duration) {
		route(true)
		removed := false
		defer func() {
			if !removed {
				route(false)
			}
		}()
		s.expectStoppedWithin(t, within)
		route(false)
		removed = true
		s.expectFlowing(t, "after the blackhole route went")
	}
	// Without the daemon, each change would stop the stream when its cached
	// answer expires, anywhere within the second after it: three changes
	// all caught within 300 ms would happen by chance one time in 37.
	t.Run("daemon-forgets-at-once", func(t *testing.T) {
		for range 3 {
			change(t, 300*time.Millisecond)
		}
	})
	t.Run("expiry-without-daemon", func(t *testing.T) {
		pid := c.nodes[0].DaemonPID()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
		change(t, 1200*time.Millisecond)
	})
	// An answer taken from the cache still checks the egress MTU as the
	// lookup does: a datagram over node0's uplink MTU (lowered below the
	// pod's; the underlay side keeps 1500, so the veth alone would carry
	// it) in the flow whose small datagrams keep its answer cached takes
	// the host's path, which answers "fragmentation needed" for it.
	t.Run("mtu-checked-on-a-cached-answer", func(t *testing.T) {
		if err := c.nodes[0].NS.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("uplink0")
			if err != nil {
				return err
			}
			return netlink.LinkSetMTU(l, 1400)
		}); err != nil {
			t.Fatal(err)
		}
		s.expectFlowing(t, "with the uplink's MTU lowered")
		before := hostRouteStats(t, c.nodes[0])
		s.sendBig(t, 1450)
		select {
		case <-s.big:
			t.Fatal("a datagram over the uplink's MTU was host-routed from a cached answer")
		case <-time.After(500 * time.Millisecond):
		}
		if got := statDelta(before, hostRouteStats(t, c.nodes[0]), bpf.CoordinoHostrouteStatHR_STAT_NO_ROUTE); got < 1 {
			t.Errorf("the oversized datagram was not counted as taking the host's path (no-route: %d)", got)
		}
	})
}

// udpStream is a small datagram every few milliseconds from one pod to
// another, with the arrival times of those received; sendBig adds a larger
// one on the same flow, whose arrival big tells.
type udpStream struct {
	conn    net.Conn
	arrived chan time.Time
	big     chan struct{}
}

// sendBig sends a datagram of size bytes with Don't Fragment set.
func (s *udpStream) sendBig(t *testing.T, size int) {
	t.Helper()
	raw, err := s.conn.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	if _, err := s.conn.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
}

func startUDPStream(t *testing.T, from, to *pod, port int) *udpStream {
	t.Helper()
	got := receiveUDP(t, to, port)
	s := &udpStream{arrived: make(chan time.Time, 4096), big: make(chan struct{}, 1)}
	go func() {
		for msg := range got {
			if len(msg) > 1000 {
				select {
				case s.big <- struct{}{}:
				default:
				}
				continue
			}
			select {
			case s.arrived <- time.Now():
			default:
			}
		}
	}()
	if err := from.NS.Do(func(ns.NetNS) error {
		var err error
		s.conn, err = net.Dial("udp4", netip.AddrPortFrom(to.addr(false), uint16(port)).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	conn := s.conn
	done := make(chan struct{})
	t.Cleanup(func() { close(done); conn.Close() })
	go func() {
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			_, _ = fmt.Fprintf(conn, "%d", i)
		}
	}()
	return s
}

// drain returns how many datagrams arrived since the last call, and when
// the last of them did.
func (s *udpStream) drain() (n int, last time.Time) {
	for {
		select {
		case at := <-s.arrived:
			n, last = n+1, at
		default:
			return n, last
		}
	}
}

// expectFlowing waits for datagrams to arrive again, then for a steady
// second of them.
func (s *udpStream) expectFlowing(t *testing.T, when string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	s.drain()
	for {
		time.Sleep(100 * time.Millisecond)
		if n, _ := s.drain(); n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no datagram arrives", when)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if n, _ := s.drain(); n < 20 {
		t.Fatalf("%s: %d datagrams in 300 ms, want a steady stream (>= 20)", when, n)
	}
}

// expectStoppedWithin checks that nothing arrives later than within after
// now, watching for a further half second.
func (s *udpStream) expectStoppedWithin(t *testing.T, within time.Duration) {
	t.Helper()
	changed := time.Now()
	s.drain()
	time.Sleep(within + 500*time.Millisecond)
	n, last := s.drain()
	if n > 0 && last.Sub(changed) > within {
		t.Fatalf("datagrams still arrived %v after the change, want none after %v (%d since the change)", last.Sub(changed).Round(time.Millisecond), within, n)
	}
}
