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
// route learned from a router advertisement.
func raDefaultRoute() (bool, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Protocol: unix.RTPROT_RA}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return false, err
	}
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			return true, nil
		}
	}
	return false, nil
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

// TestEnableForwardingKeepsRouterAdvertisements: a node whose default route
// comes from router advertisements keeps it when the daemon turns on IPv6
// forwarding, and keeps accepting RAs after. Before, flipping
// conf/all/forwarding made the kernel drop the route and ignore RAs.
func TestEnableForwardingKeepsRouterAdvertisements(t *testing.T) {
	privileged.Require(t)
	node, router := newNS(t), newNS(t)
	do(t, node, func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "rtr0", PeerNamespace: netlink.NsFd(int(router.Fd()))}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		if v, _ := netSysctl("ipv6/conf/uplink0/accept_ra"); v != "1" {
			return fmt.Errorf("uplink0 accept_ra = %q, the test needs the kernel default 1", v)
		}
		return netlink.LinkSetUp(v)
	})
	var sendRA func() error
	do(t, router, func() error {
		l, err := netlink.LinkByName("rtr0")
		if err != nil {
			return err
		}
		ll, _ := netlink.ParseIPNet("fe80::1/64")
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ll, Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		sendRA, err = raSender(t, "rtr0")
		return err
	})
	if err := waitRADefaultRoute(node, true, sendRA); err != nil {
		t.Fatalf("before EnableForwarding: %v", err)
	}
	do(t, node, func() error { return EnableForwarding(true) })
	do(t, node, func() error {
		for name, want := range map[string]string{"ipv6/conf/all/forwarding": "1", "ipv6/conf/uplink0/accept_ra": "2"} {
			if v, err := netSysctl(name); err != nil || v != want {
				t.Errorf("%s = %q (%v), want %s", name, v, err, want)
			}
		}
		return nil
	})
	do(t, node, func() error {
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
