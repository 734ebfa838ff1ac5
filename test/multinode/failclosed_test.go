package multinode

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/test/harness"
)

// checkContainerEndFailsClosed ends node0's daemon and its userspace
// device together, as deleting the daemon's pod does in Kubernetes, while
// node0's pod sends datagrams carrying the plaintext marker to node1's pod
// over both families, and node0's default routes lead to node1 (a gateway
// that would forward them). No pod packet may cross the underlay in the
// clear while the device is gone; after the daemon's restart the pods reach
// each other again, through the tunnel only.
func checkContainerEndFailsClosed(t *testing.T, c *cluster) {
	n0, n1 := c.nodes[0], c.nodes[1]
	restore := defaultRoutesVia(t, n0, n1)
	defer restore()
	capture := startCapture(t, c)

	var conns []net.Conn
	for _, v6 := range []bool{false, true} {
		conn, err := harness.DialFrom(n0.pods[0].NS, "udp", n1.pods[0].addr(v6), echoPort, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conns = append(conns, conn)
	}
	var sent, inGap atomic.Int64
	var gap atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			for _, conn := range conns {
				_, _ = conn.Write(plaintextMarker)
				sent.Add(1)
				if gap.Load() {
					inGap.Add(1)
				}
			}
		}
	}()

	pid := n0.wgPID()
	if pid == 0 {
		t.Fatal("no userspace WireGuard PID file")
	}
	gap.Store(true)
	if err := n0.StopDaemon(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(pid, 5*time.Second)
	if err := n0.NS.Do(func(ns.NetNS) error {
		return eventually(5*time.Second, func() error {
			if _, err := netlink.LinkByName(n0.wgDevice); err == nil {
				return fmt.Errorf("device %s still there after its process ended", n0.wgDevice)
			}
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	// Long enough for a leak to show: the datagrams keep coming.
	time.Sleep(500 * time.Millisecond)
	c.startDaemon(n0)
	gap.Store(false)
	for _, v6 := range []bool{false, true} {
		if err := reach(n0.pods[0].NS, n1.pods[0], v6); err != nil {
			t.Fatalf("after the restart (v6=%v): %v", v6, err)
		}
	}
	close(stop)
	wg.Wait()
	if inGap.Load() < 100 {
		t.Fatalf("only %d datagrams sent while the device was gone: the gap was not exercised", inGap.Load())
	}
	t.Logf("%d datagrams sent, %d while node0 had no device", sent.Load(), inGap.Load())
	// The marker over TCP, and every frame since the capture began: only
	// tunnel UDP between node addresses.
	capture.check(t, c)
}

// defaultRoutesVia points from's default routes (both families) at via's
// underlay addresses, as a node's gateway, and returns what restores them.
func defaultRoutesVia(t *testing.T, from, via *node) func() {
	t.Helper()
	var added []netlink.Route
	var replaced []netlink.Route
	if err := from.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		for _, v6 := range []bool{false, true} {
			dst := ipNet(netip.PrefixFrom(netip.IPv4Unspecified(), 0))
			if v6 {
				dst = ipNet(netip.PrefixFrom(netip.IPv6Unspecified(), 0))
			}
			all, err := netlink.RouteList(nil, familyOf(v6))
			if err != nil {
				return err
			}
			for _, r := range all {
				if r.Dst != nil && r.Dst.IP.IsUnspecified() {
					if ones, _ := r.Dst.Mask.Size(); ones != 0 {
						continue
					}
				} else if r.Dst != nil {
					continue
				}
				if err := netlink.RouteDel(&r); err != nil {
					return err
				}
				replaced = append(replaced, r)
			}
			r := netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst, Gw: via.address(v6).AsSlice()}
			if err := netlink.RouteAdd(&r); err != nil {
				return fmt.Errorf("default route via %s: %w", via.address(v6), err)
			}
			added = append(added, r)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return func() {
		_ = from.NS.Do(func(ns.NetNS) error {
			for _, r := range added {
				_ = netlink.RouteDel(&r)
			}
			for _, r := range replaced {
				_ = netlink.RouteAdd(&r)
			}
			return nil
		})
	}
}

func familyOf(v6 bool) int {
	if v6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}
