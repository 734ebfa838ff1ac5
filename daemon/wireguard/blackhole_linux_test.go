package wireguard

import (
	"bytes"
	"errors"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/coordino/coordino/daemon/peers"
	"github.com/coordino/coordino/daemon/routing"
)

// leakMarker is the payload sent to other nodes' pods: seeing it on the
// uplink means a pod packet left the node in the clear.
var leakMarker = []byte("coordino-cleartext-probe-5be1")

// TestOtherNodesBlocksFailClosed: on a node whose default route leads out
// of its uplink, the blocks of a peer without a published key, and those of
// a keyed peer once the userspace device is gone (its process ended with
// the daemon's container), are dropped, never sent out of the uplink in the
// clear; a keyed peer's blocks go to the device while it exists; turning
// encryption off removes the blackholes. The control (an address in no
// block) shows the uplink capture sees what the default route carries.
func TestOtherNodesBlocksFailClosed(t *testing.T) {
	netns, cfg, log := deviceFixture(t, "cwb")
	cfg.Kind = KindUserspace
	peerKey, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	pfx := netip.MustParsePrefix
	set := peers.Set{
		"a": {Name: "a", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")}, Blocks: []netip.Prefix{pfx("10.20.0.0/24"), pfx("fd00:20::/64")}},
		"b": {Name: "b", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.2")}, Blocks: []netip.Prefix{pfx("10.20.1.0/24"), pfx("fd00:20:1::/64")},
			WireGuard: &peers.WireGuard{PublicKey: peerKey.PublicKey().String()}},
		"c": {Name: "c", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.3")}, Blocks: []netip.Prefix{pfx("10.20.2.0/24"), pfx("fd00:20:2::/64")}},
	}
	keyed := []netip.Addr{netip.MustParseAddr("10.20.1.7"), netip.MustParseAddr("fd00:20:1::7")}
	keyless := []netip.Addr{netip.MustParseAddr("10.20.2.7"), netip.MustParseAddr("fd00:20:2::7")}
	control := []netip.Addr{netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("2001:db8:ff::7")}

	err = netns.Do(func(ns.NetNS) error {
		up, err := plainUplink()
		if err != nil {
			return err
		}
		d, err := Start(cfg, log)
		if err != nil {
			return err
		}
		defer d.Close()
		if err := d.Apply(set); err != nil {
			return err
		}
		// Reconciled with the peer set: a peer that leaves takes its
		// blackholes along, one that comes back brings them again, and
		// an unchanged set changes nothing.
		wantHoles := func(peers ...string) {
			t.Helper()
			var want []string
			for _, p := range peers {
				for _, b := range set[p].Blocks {
					want = append(want, b.String())
				}
			}
			if got := blackholes(t); !slices.Equal(got, sorted(want)) {
				t.Errorf("blackholes %v, want those of %v: %v", got, peers, sorted(want))
			}
		}
		wantHoles("b", "c")
		without := maps.Clone(set)
		delete(without, "c")
		if err := d.Apply(without); err != nil {
			return err
		}
		wantHoles("b")
		for i := 0; i < 2; i++ {
			if err := d.Apply(set); err != nil {
				return err
			}
		}
		wantHoles("b", "c")
		dev, err := netlink.LinkByName(cfg.Device)
		if err != nil {
			return err
		}
		if n := leaked(t, up, control); n == 0 {
			t.Fatal("control: nothing seen on the uplink for an address only the default route covers")
		}
		if n := leaked(t, up, keyless); n != 0 {
			t.Errorf("peer without a key: %d pod packets left in the clear", n)
		}
		for _, a := range keyed {
			rs, err := netlink.RouteGet(a.AsSlice())
			if err != nil || len(rs) == 0 || rs[0].LinkIndex != dev.Attrs().Index {
				t.Errorf("keyed peer's %v: routes %v (%v), want the device %s", a, rs, err, cfg.Device)
			}
		}
		// The device ends as it does with the daemon's container.
		if err := syscall.Kill(readPID(t, cfg), syscall.SIGKILL); err != nil {
			return err
		}
		if err := waitLinkGone(cfg.Device); err != nil {
			return err
		}
		if n := leaked(t, up, keyed); n != 0 {
			t.Errorf("keyed peer, device gone: %d pod packets left in the clear", n)
		}
		if n := leaked(t, up, keyless); n != 0 {
			t.Errorf("peer without a key, device gone: %d pod packets left in the clear", n)
		}
		// Encryption turned off: no blackhole may stay behind.
		if err := RemoveStale(cfg, log); err != nil {
			return err
		}
		if left := blackholes(t); len(left) != 0 {
			t.Errorf("after RemoveStale: blackhole routes left: %v", left)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// blackholes lists the destinations of the blackhole routes of
// routing.BlackholeProtocol in the main table, sorted; each must be a
// blackhole of routing.BlackholeMetric.
func blackholes(t *testing.T) []string {
	t.Helper()
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: routing.BlackholeProtocol, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		if r.Type != unix.RTN_BLACKHOLE || r.Priority != routing.BlackholeMetric {
			t.Errorf("route %v: type %d metric %d, want a blackhole (%d) of metric %d", r.Dst, r.Type, r.Priority, unix.RTN_BLACKHOLE, routing.BlackholeMetric)
		}
		out = append(out, r.Dst.String())
	}
	return sorted(out)
}

func sorted(s []string) []string { slices.Sort(s); return s }

// plainUplink gives the namespace an uplink (a veth, its peer up beside
// it) holding both families' default routes via a gateway with a
// permanent neighbour entry, as a node's default gateway would be.
func plainUplink() (netlink.Link, error) {
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0"}, PeerName: "uplink0p"}); err != nil {
		return nil, err
	}
	for _, name := range []string{"lo", "uplink0p"} {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return nil, err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, err
		}
	}
	l, err := netlink.LinkByName("uplink0")
	if err != nil {
		return nil, err
	}
	gwMAC := net.HardwareAddr{0x02, 0, 0, 0, 0, 0xfe}
	for _, a := range []struct{ addr, gw string }{{"192.0.2.1/24", "192.0.2.254"}, {"2001:db8::1/64", "2001:db8::fe"}} {
		p := netip.MustParsePrefix(a.addr)
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(l, addr); err != nil {
			return nil, err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, err
		}
		gw := netip.MustParseAddr(a.gw)
		fam := netlink.FAMILY_V4
		if gw.Is6() {
			fam = netlink.FAMILY_V6
		}
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: fam, State: netlink.NUD_PERMANENT, IP: gw.AsSlice(), HardwareAddr: gwMAC}); err != nil {
			return nil, err
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// leaked sends five datagrams carrying leakMarker to each of dsts (a send
// the route refuses is fine) and counts the frames with the marker that
// left through up; the caller is in up's namespace.
func leaked(t *testing.T, up netlink.Link, dsts []netip.Addr) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		t.Fatalf("AF_PACKET socket: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: up.Attrs().Index}); err != nil {
		t.Fatalf("bind to %s: %v", up.Attrs().Name, err)
	}
	tv := unix.Timeval{Usec: 200000}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	for _, dst := range dsts {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9)))
		if err != nil {
			continue // refused at connect: nothing can leave either
		}
		for i := 0; i < 5; i++ {
			_, _ = c.Write(leakMarker)
		}
		c.Close()
	}
	n := 0
	buf := make([]byte, 65536)
	for {
		m, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return n
		}
		if bytes.Contains(buf[:m], leakMarker) {
			n++
		}
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func readPID(t *testing.T, cfg Config) int {
	t.Helper()
	data, err := os.ReadFile(PIDFile(cfg.RunDir, cfg.Device))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("PID file of %s: %v", cfg.Device, err)
	}
	return pid
}

func waitLinkGone(name string) error {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := netlink.LinkByName(name); err != nil {
			return nil
		}
	}
	return errors.New("link " + name + " still there 5 s after its process was killed")
}
