package netsetup

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/privileged"
)

// raSender opens, in the calling thread's netns, a socket that sends router
// advertisements (router lifetime 1800 s) out of ifname to all nodes; the
// returned func sends one, from any thread.
func raSender(t *testing.T, ifname string) (func() error, error) {
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMPV6)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS, 255); err != nil {
		return nil, err
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_IF, l.Attrs().Index); err != nil {
		return nil, err
	}
	// Type 134, code 0, checksum (the kernel fills it in), hop limit 64,
	// flags 0, router lifetime, reachable time, retransmission timer.
	ra := make([]byte, 16)
	ra[0], ra[4] = 134, 64
	binary.BigEndian.PutUint16(ra[6:], 1800)
	dst := &unix.SockaddrInet6{ZoneId: uint32(l.Attrs().Index)}
	copy(dst.Addr[:], net.ParseIP("ff02::1").To16())
	return func() error { return unix.Sendto(fd, ra, 0, dst) }, nil
}

// raDefaultRoute reports whether the calling thread's netns has a default
// route learned from a router advertisement, and through which interfaces.
func raDefaultRoute() (bool, error) {
	via, err := raDefaultVia()
	return len(via) > 0, err
}

func raDefaultVia() (map[int]bool, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Protocol: unix.RTPROT_RA}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, err
	}
	via := map[int]bool{}
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			via[r.LinkIndex] = true
		}
	}
	return via, nil
}

// waitRADefaultRoute waits until node has (want) or lacks an RA-learned
// default route, sending an RA every 100 ms while it waits for one: the
// first ones can be lost while a fresh link's qdisc is not yet active.
func waitRADefaultRoute(node ns.NetNS, want bool, sendRA func() error) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		if want {
			if err := sendRA(); err != nil {
				return err
			}
		}
		var have bool
		err := node.Do(func(ns.NetNS) (err error) { have, err = raDefaultRoute(); return })
		if err != nil || have == want {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("RA-learned default route present = %v, want %v", have, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// raNeighbour links node's interface nodeIf by a veth to a new netns whose
// end has the link-local address ll, and returns a func sending RAs from it.
func raNeighbour(t *testing.T, node ns.NetNS, nodeIf, ll string) func() error {
	t.Helper()
	peer := newNS(t)
	do(t, node, func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nodeIf}, PeerName: "ra0", PeerNamespace: netlink.NsFd(int(peer.Fd()))}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		if v, _ := netSysctl("ipv6/conf/" + nodeIf + "/accept_ra"); v != "1" {
			return fmt.Errorf("%s accept_ra = %q, the test needs the kernel default 1", nodeIf, v)
		}
		return netlink.LinkSetUp(v)
	})
	var send func() error
	do(t, peer, func() error {
		l, err := netlink.LinkByName("ra0")
		if err != nil {
			return err
		}
		a, _ := netlink.ParseIPNet(ll)
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: a, Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		send, err = raSender(t, "ra0")
		return err
	})
	return send
}

// TestEnableForwardingKeepsRouterAdvertisements: a node whose default route
// comes from router advertisements keeps it when the daemon turns on IPv6
// forwarding, and keeps accepting RAs after; an interface the node does not
// rely on RAs through (a pod-facing veth of another CNI) ignores them. Before,
// flipping conf/all/forwarding made the kernel drop the route and ignore RAs.
func TestEnableForwardingKeepsRouterAdvertisements(t *testing.T) {
	privileged.Require(t)
	node := newNS(t)
	sendRA := raNeighbour(t, node, "uplink0", "fe80::1/64")
	podRA := raNeighbour(t, node, "calx0", "fe80::2/64")
	if err := waitRADefaultRoute(node, true, sendRA); err != nil {
		t.Fatalf("before EnableForwarding: %v", err)
	}
	do(t, node, func() error { return EnableForwarding(true) })
	do(t, node, func() error {
		for name, want := range map[string]string{"ipv6/conf/all/forwarding": "1", "ipv6/conf/uplink0/accept_ra": "2",
			"ipv6/conf/calx0/accept_ra": "1", "ipv6/conf/calx0/forwarding": "1"} {
			if v, err := netSysctl(name); err != nil || v != want {
				t.Errorf("%s = %q (%v), want %s", name, v, err, want)
			}
		}
		if have, err := raDefaultRoute(); err != nil || !have {
			t.Fatalf("turning on forwarding cost the node its RA-learned default route (%v)", err)
		}
		return nil
	})
	// RAs are still accepted: a withdrawn route comes back with the next one.
	do(t, node, func() error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Protocol: unix.RTPROT_RA}, netlink.RT_FILTER_PROTOCOL)
		for _, r := range routes {
			if err := netlink.RouteDel(&r); err != nil {
				return err
			}
		}
		return err
	})
	if err := waitRADefaultRoute(node, false, sendRA); err != nil {
		t.Fatal(err)
	}
	if err := waitRADefaultRoute(node, true, sendRA); err != nil {
		t.Fatalf("after EnableForwarding the node ignores RAs: %v", err)
	}
	// A pod's RA through the other interface is ignored.
	for range 5 {
		if err := podRA(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	do(t, node, func() error {
		l, err := netlink.LinkByName("calx0")
		if err != nil {
			return err
		}
		via, err := raDefaultVia()
		if err == nil && via[l.Attrs().Index] {
			t.Error("the node took a default route from an RA sent by a pod")
		}
		return err
	})
	// A pod-facing veth created afterwards inherits forwarding and ignores RAs.
	do(t, node, func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: HostIfName("t", "c", "eth0")}, PeerName: "podside0"}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		if f, _ := netSysctl("ipv6/conf/" + v.Name + "/forwarding"); f != "1" {
			t.Errorf("a new host veth has forwarding %q, want 1 (ignores RAs from pods)", f)
		}
		return nil
	})
}
