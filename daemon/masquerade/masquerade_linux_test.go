package masquerade

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/privileged"
)

// bed is a routed pod, its node and an outside host on the node's uplink.
// The outside host routes the pod CIDRs back to the node, so that an
// unmasqueraded connection also completes and shows the pod's address.
type bed struct {
	pod, node, out ns.NetNS
}

var (
	podAddr  = map[bool]netip.Addr{false: netip.MustParseAddr("10.77.0.2"), true: netip.MustParseAddr("fd77::2")}
	podGw    = map[bool]netip.Addr{false: netip.MustParseAddr("10.77.0.1"), true: netip.MustParseAddr("fd77::1")}
	nodeAddr = map[bool]netip.Addr{false: netip.MustParseAddr("198.51.100.1"), true: netip.MustParseAddr("2001:db8:77::1")}
	outAddr  = map[bool]netip.Addr{false: netip.MustParseAddr("198.51.100.99"), true: netip.MustParseAddr("2001:db8:77::99")}
	podNets  = pfx("10.77.0.0/24", "fd77::/64")
)

func bits(a netip.Addr) int {
	if a.Is4() {
		return 24
	}
	return 64
}

func newBed(t *testing.T) *bed {
	t.Helper()
	privileged.Require(t)
	b := &bed{}
	for _, p := range []*ns.NetNS{&b.pod, &b.node, &b.out} {
		n, err := testutils.NewNS()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close(); _ = testutils.UnmountNS(n) })
		*p = n
	}
	b.link(t, b.pod, "eth0", b.node, "hpod", podAddr, podGw)
	b.link(t, b.node, "up0", b.out, "out0", nodeAddr, outAddr)
	must(t, b.pod.Do(func(ns.NetNS) error {
		for _, v6 := range []bool{false, true} {
			if err := netlink.RouteAdd(&netlink.Route{Dst: defaultRoute(v6), Gw: podGw[v6].AsSlice()}); err != nil {
				return err
			}
		}
		return nil
	}))
	must(t, b.out.Do(func(ns.NetNS) error {
		for _, v6 := range []bool{false, true} {
			if err := netlink.RouteAdd(&netlink.Route{Dst: prefixNet(podNets[boolIndex(v6)]), Gw: nodeAddr[v6].AsSlice()}); err != nil {
				return err
			}
		}
		return nil
	}))
	must(t, b.node.Do(func(ns.NetNS) error {
		for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
				return err
			}
		}
		return nil
	}))
	return b
}

func boolIndex(v6 bool) int {
	if v6 {
		return 1
	}
	return 0
}

func defaultRoute(v6 bool) *net.IPNet {
	if v6 {
		return prefixNet(netip.MustParsePrefix("::/0"))
	}
	return prefixNet(netip.MustParsePrefix("0.0.0.0/0"))
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// link joins a (name an) and z (name zn) by a veth with the addresses of
// each side per family.
func (b *bed) link(t *testing.T, a ns.NetNS, an string, z ns.NetNS, zn string, aAddr, zAddr map[bool]netip.Addr) {
	t.Helper()
	must(t, a.Do(func(ns.NetNS) error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: an}, PeerName: zn, PeerNamespace: netlink.NsFd(int(z.Fd()))})
	}))
	for _, side := range []struct {
		n     ns.NetNS
		name  string
		addrs map[bool]netip.Addr
	}{{a, an, aAddr}, {z, zn, zAddr}} {
		must(t, side.n.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(side.name)
			if err != nil {
				return err
			}
			for _, ad := range side.addrs {
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(ad, bits(ad))), Flags: unix.IFA_F_NODAD}); err != nil {
					return err
				}
			}
			lo, _ := netlink.LinkByName("lo")
			_ = netlink.LinkSetUp(lo)
			return netlink.LinkSetUp(l)
		}))
	}
}

// serve answers every TCP connection on the outside host with the address
// it came from.
func (b *bed) serve(t *testing.T, v6 bool) netip.AddrPort {
	t.Helper()
	var l net.Listener
	must(t, b.out.Do(func(ns.NetNS) (err error) {
		l, err = net.Listen("tcp", netip.AddrPortFrom(outAddr[v6], 0).String())
		return err
	}))
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					if _, err := r.ReadString('\n'); err != nil {
						return
					}
					fmt.Fprintf(c, "%s\n", netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap())
				}
			}()
		}
	}()
	return netip.MustParseAddrPort(l.Addr().String())
}

// dial opens a connection from the pod.
func (b *bed) dial(t *testing.T, to netip.AddrPort) net.Conn {
	t.Helper()
	var c net.Conn
	must(t, b.pod.Do(func(ns.NetNS) (err error) {
		c, err = net.DialTimeout("tcp", to.String(), 3*time.Second)
		return err
	}))
	t.Cleanup(func() { c.Close() })
	return c
}

// seenAs is the address the outside host sees c's connection from.
func seenAs(t *testing.T, c net.Conn) netip.Addr {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintln(c, "who"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return netip.MustParseAddr(line[:len(line)-1])
}

func TestMasquerade(t *testing.T) {
	b := newBed(t)
	tbl := &Table{NetNS: int(b.node.Fd())}
	cfg := Config{Sources: podNets, Cluster: podNets}
	must(t, tbl.Apply(cfg))
	for _, v6 := range []bool{false, true} {
		t.Run(fmt.Sprintf("v6=%v", v6), func(t *testing.T) {
			srv := b.serve(t, v6)
			open := b.dial(t, srv)
			if got := seenAs(t, open); got != nodeAddr[v6] {
				t.Fatalf("outside host sees %s, want the node's %s", got, nodeAddr[v6])
			}

			// A non-masquerade CIDR naming the outside host: new
			// connections keep the pod's address, by set delta.
			withOut := cfg
			withOut.Cluster = append(pfx(outAddr[v6].String()+"/32"), podNets...)
			if v6 {
				withOut.Cluster = append(pfx(outAddr[v6].String()+"/128"), podNets...)
			}
			must(t, tbl.Apply(withOut))
			if got := seenAs(t, b.dial(t, srv)); got != podAddr[v6] {
				t.Fatalf("with the outside host non-masqueraded it sees %s, want the pod's %s", got, podAddr[v6])
			}
			// The pool exempt from NAT (natOutgoing false).
			exempt := cfg
			exempt.Exempt = podNets
			must(t, tbl.Apply(exempt))
			if got := seenAs(t, b.dial(t, srv)); got != podAddr[v6] {
				t.Fatalf("with the pod's pool exempt the outside host sees %s, want the pod's %s", got, podAddr[v6])
			}
			must(t, tbl.Apply(cfg))

			// A restarted daemon's first Apply rewrites the whole table:
			// the open flow keeps its translation, new ones get theirs.
			must(t, (&Table{NetNS: int(b.node.Fd())}).Apply(cfg))
			if got := seenAs(t, open); got != nodeAddr[v6] {
				t.Fatalf("after a restart the open flow is seen as %s, want %s", got, nodeAddr[v6])
			}
			if got := seenAs(t, b.dial(t, srv)); got != nodeAddr[v6] {
				t.Fatalf("after a restart a new flow is seen as %s, want %s", got, nodeAddr[v6])
			}
		})
	}
	cs, ok, err := tbl.Counters()
	must(t, err)
	if !ok || cs.Connections["ipv4"] < 2 || cs.Connections["ipv6"] < 2 {
		t.Fatalf("counters %+v (table there: %v), want at least 2 connections per family", cs, ok)
	}

	must(t, tbl.Remove())
	must(t, tbl.Remove()) // absent is fine
	if _, ok, err := tbl.Counters(); err != nil || ok {
		t.Fatalf("after Remove: table there %v, err %v", ok, err)
	}
	// Without the table the outside host sees the pod (it routes pods back).
	if got := seenAs(t, b.dial(t, b.serve(t, false))); got != podAddr[false] {
		t.Fatalf("without masquerade the outside host sees %s, want the pod's %s", got, podAddr[false])
	}
}

// TestApplyDeltas: the sets hold exactly the merged ranges after updates
// that grow, shrink and replace them.
func TestApplyDeltas(t *testing.T) {
	b := newBed(t)
	tbl := &Table{NetNS: int(b.node.Fd())}
	steps := [][]netip.Prefix{
		pfx("10.1.0.0/24", "10.2.0.0/24", "fd00::/64"),
		pfx("10.1.0.0/16", "10.2.0.0/24", "fd00::/64", "fd01::/64"),
		pfx("10.2.0.0/24", "10.3.0.0/24", "0.0.0.0/0"),
		pfx("10.9.0.0/24"),
		nil,
	}
	for i, cluster := range steps {
		must(t, tbl.Apply(Config{Sources: podNets, Cluster: cluster}))
		for _, v6 := range []bool{false, true} {
			got := b.setSpans(t, "cluster", v6)
			want := spans(cluster, v6)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("step %d v6=%v: set holds %v, want %v", i, v6, got, want)
			}
		}
	}
}

// setSpans reads a set back from the kernel as spans.
func (b *bed) setSpans(t *testing.T, name string, v6 bool) []span {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(b.node.Fd())))
	must(t, err)
	suffix := "4"
	if v6 {
		suffix = "6"
	}
	s, err := c.GetSetByName(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}, name+suffix)
	must(t, err)
	els, err := c.GetSetElements(s)
	must(t, err)
	type el struct {
		a   netip.Addr
		end bool
	}
	var sorted []el
	for _, e := range els {
		a, _ := netip.AddrFromSlice(e.Key)
		sorted = append(sorted, el{a, e.IntervalEnd})
	}
	for i := range sorted {
		for j := i + 1; j < len(sorted); j++ {
			if sorted[j].a.Less(sorted[i].a) || (sorted[j].a == sorted[i].a && sorted[j].end) {
				sorted[i], sorted[j] = sorted[j], sorted[i]
			}
		}
	}
	var out []span
	for _, e := range sorted {
		if e.end {
			if len(out) > 0 && !out[len(out)-1].end.IsValid() {
				out[len(out)-1].end = e.a
			}
			continue
		}
		out = append(out, span{start: e.a})
	}
	return out
}
