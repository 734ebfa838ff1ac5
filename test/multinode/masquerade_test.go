package multinode

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/harness"
)

// outside is a host on the underlay that is not a node: it has no route to
// the pod CIDRs. Its first address (masq) is what pods reach masqueraded;
// the second (direct) is a non-masquerade CIDR, and only from that address
// does the host route the pod blocks back (a source-address rule), as a
// routed corporate network would.
type outside struct {
	ns ns.NetNS
}

const (
	whoPort     = 7070
	directTable = 201
)

func (o *outside) masq(v6 bool) netip.Addr {
	if v6 {
		return netip.MustParseAddr("2001:db8::c8")
	}
	return netip.MustParseAddr("192.0.2.200")
}

func (o *outside) direct(v6 bool) netip.Addr {
	if v6 {
		return netip.MustParseAddr("2001:db8::c9")
	}
	return netip.MustParseAddr("192.0.2.201")
}

// nonMasqueradeArgs are the daemons' flags naming the outside host's
// direct addresses.
func nonMasqueradeArgs(o *outside) []string {
	return []string{"--non-masquerade-cidrs", o.direct(false).String() + "/32," + o.direct(true).String() + "/128"}
}

// newOutside plugs the outside host into c's underlay and serves: on TCP,
// each line is answered with the address the connection comes from; on
// UDP, each datagram likewise; ICMP echo is the kernel's.
func newOutside(t *testing.T, c *cluster) *outside {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(); _ = testutils.UnmountNS(n) })
	o := &outside{ns: n}
	port := "po-" + harness.RandomSuffix(6)
	if err := n.Do(func(ns.NetNS) error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", MTU: 1500}, PeerName: port, PeerNamespace: netlink.NsFd(int(c.underlay.Fd()))}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		lo, _ := netlink.LinkByName("lo")
		_ = netlink.LinkSetUp(lo)
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		for _, v6 := range []bool{false, true} {
			bits := 24
			if v6 {
				bits = 64
			}
			for _, a := range []netip.Addr{o.masq(v6), o.direct(v6)} {
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(a, bits)), Flags: unix.IFA_F_NODAD}); err != nil {
					return err
				}
			}
			// Only the direct address routes pods back.
			rule := netlink.NewRule()
			rule.Src, rule.Table, rule.Family = ipNet(netip.PrefixFrom(o.direct(v6), o.direct(v6).BitLen())), directTable, unix.AF_INET
			if v6 {
				rule.Family = unix.AF_INET6
			}
			if err := netlink.RuleAdd(rule); err != nil {
				return err
			}
			for _, nd := range c.nodes {
				for _, b := range nd.blocks() {
					if b.Addr().Is6() == v6 {
						if err := netlink.RouteAdd(&netlink.Route{Dst: ipNet(b), Gw: nd.address(v6).AsSlice(), Table: directTable}); err != nil {
							return err
						}
					}
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("outside host: %v", err)
	}
	if err := c.bridgePort(port, c.bridge); err != nil {
		t.Fatalf("outside host's bridge port: %v", err)
	}
	o.serve(t)
	return o
}

func (o *outside) serve(t *testing.T) {
	t.Helper()
	serveWho(t, o.ns, netip.AddrPortFrom(netip.IPv6Unspecified(), whoPort))
	// UDP per address: a wildcard socket answers from the host's first
	// address, which a connected client does not accept.
	for _, v6 := range []bool{false, true} {
		for _, a := range []netip.Addr{o.masq(v6), o.direct(v6)} {
			var pc net.PacketConn
			if err := o.ns.Do(func(ns.NetNS) (err error) {
				pc, err = net.ListenPacket("udp", netip.AddrPortFrom(a, whoPort).String())
				return err
			}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pc.Close() })
			go func() {
				buf := make([]byte, 64)
				for {
					_, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = pc.WriteTo([]byte(netip.MustParseAddrPort(from.String()).Addr().Unmap().String()), from)
				}
			}()
		}
	}
}

// serveWho answers each line on every TCP connection to addr in n with the
// address the connection comes from.
func serveWho(t *testing.T, n ns.NetNS, at netip.AddrPort) {
	t.Helper()
	stop, err := harness.ServeTCP(n, at, func(c net.Conn) {
		from := netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap()
		r := bufio.NewReader(c)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", from)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
}

// ask sends a line on c and returns the address the outside host saw.
func ask(c net.Conn) (netip.Addr, error) {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintln(c, "who"); err != nil {
		return netip.Addr{}, err
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		return netip.Addr{}, err
	}
	return netip.ParseAddr(strings.TrimSpace(string(buf[:n])))
}

// seenFrom opens a proto ("tcp" or "udp") connection from p to addr and
// returns the address the outside host saw it from.
func seenFrom(p *pod, proto string, addr netip.Addr) (netip.Addr, error) {
	var got netip.Addr
	err := eventually(3*time.Second, func() error {
		c, err := harness.DialFrom(p.NS, proto, addr, whoPort, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		got, err = ask(c)
		return err
	})
	return got, err
}

// ping sends ICMP echo requests from p to addr until one is answered.
func ping(p *pod, addr netip.Addr) error {
	return p.NS.Do(func(ns.NetNS) error {
		network, listen, proto := "ip4:icmp", "0.0.0.0", 1
		var typ, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
		if addr.Is6() {
			network, listen, proto = "ip6:ipv6-icmp", "::", 58
			typ, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
		}
		c, err := icmp.ListenPacket(network, listen)
		if err != nil {
			return err
		}
		defer c.Close()
		id := os.Getpid() & 0xffff
		deadline := time.Now().Add(3 * time.Second)
		for seq := 1; time.Now().Before(deadline); seq++ {
			msg, _ := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("coordino")}}).Marshal(nil)
			if _, err := c.WriteTo(msg, &net.IPAddr{IP: addr.AsSlice()}); err != nil {
				return err
			}
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			buf := make([]byte, 1500)
			for {
				n, from, err := c.ReadFrom(buf)
				if err != nil {
					break
				}
				m, err := icmp.ParseMessage(proto, buf[:n])
				if err != nil || m.Type != reply || from.String() != addr.String() {
					continue
				}
				if e, ok := m.Body.(*icmp.Echo); ok && e.Seq == seq {
					return nil
				}
			}
		}
		return fmt.Errorf("no echo reply from %s", addr)
	})
}

const denyOutsidePolicy = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: outside-except-one, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
    - to:
        - ipBlock: {cidr: 192.0.2.0/24, except: [192.0.2.200/32]}
        - ipBlock: {cidr: "2001:db8::/64", except: ["2001:db8::c8/128"]}
`

const allowOutsidePolicy = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: outside-except-one, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
    - to:
        - ipBlock: {cidr: 192.0.2.200/32}
        - ipBlock: {cidr: "2001:db8::c8/128"}
`

const ingressFromOutsidePolicy = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-outside, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
    - from:
        - ipBlock: {cidr: 192.0.2.201/32}
        - ipBlock: {cidr: "2001:db8::c9/128"}
`

// TestMasquerade: pods on every node reach a host outside the cluster over
// TCP, UDP and ICMP in both families, seen as their node's address; a
// non-masquerade CIDR sees the pod's own; an egress ipBlock is decided on
// the pod's address before the NAT; a masqueraded flow survives a daemon
// restart. Without masquerade (the old code) no connection to the outside
// host completes: it has no route to the pods.
func TestMasquerade(t *testing.T) { runMasquerade(t) }

// TestMasqueradeNFTables is the same with --datapath=nftables: the NAT
// table is the same, policy is decided by the other datapath.
func TestMasqueradeNFTables(t *testing.T) { runMasquerade(t, "--datapath=nftables") }

func runMasquerade(t *testing.T, extraArgs ...string) {
	var o *outside
	c := newClusterWith(t, direct, 2, func(dir string) []string {
		if err := os.MkdirAll(filepath.Join(dir, "policies"), 0o700); err != nil {
			t.Fatal(err)
		}
		return append(append([]string{"--policy-dir", filepath.Join(dir, "policies")}, nonMasqueradeArgs(o)...), extraArgs...)
	})
	o = newOutside(t, c)
	for _, n := range c.nodes {
		c.addPod(n)
	}

	t.Run("reach", func(t *testing.T) {
		for _, n := range c.nodes {
			p := n.pods[0]
			for _, v6 := range []bool{false, true} {
				for _, proto := range []string{"tcp", "udp"} {
					got, err := seenFrom(p, proto, o.masq(v6))
					if err != nil || got != n.address(v6) {
						t.Errorf("%s %s -> outside (v6=%v): seen as %v (%v), want the node's %s", p.Name, proto, v6, got, err, n.address(v6))
					}
					got, err = seenFrom(p, proto, o.direct(v6))
					if err != nil || got != p.addr(v6) {
						t.Errorf("%s %s -> outside non-masquerade address (v6=%v): seen as %v (%v), want the pod's %s", p.Name, proto, v6, got, err, p.addr(v6))
					}
				}
				if err := ping(p, o.masq(v6)); err != nil {
					t.Errorf("%s ping outside (v6=%v): %v", p.Name, v6, err)
				}
			}
		}
	})

	t.Run("pmtu", func(t *testing.T) { checkPMTU(t, c) })

	t.Run("restart", func(t *testing.T) {
		n := c.nodes[0]
		var open []net.Conn
		for _, v6 := range []bool{false, true} {
			conn, err := harness.DialFrom(n.pods[0].NS, "tcp", o.masq(v6), whoPort, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			open = append(open, conn)
		}
		if err := n.StopDaemon(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		c.startDaemon(n)
		for i, conn := range open {
			if got, err := ask(conn); err != nil || got != n.address(i == 1) {
				t.Errorf("open flow (v6=%v) after the restart: seen as %v (%v), want %s", i == 1, got, err, n.address(i == 1))
			}
		}
		if got, err := seenFrom(n.pods[0], "tcp", o.masq(false)); err != nil || got != n.address(false) {
			t.Errorf("new flow after the restart: seen as %v (%v)", got, err)
		}
	})

	t.Run("ingress-from-outside", func(t *testing.T) {
		n := c.nodes[1]
		p := n.pods[0]
		if err := n.WritePolicy(filepath.Join(n.Dir, "policies"), "ingress.yaml", []byte(ingressFromOutsidePolicy), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.WritePolicy(filepath.Join(n.Dir, "policies"), "ingress.yaml", nil, 10*time.Second) })
		for _, v6 := range []bool{false, true} {
			serveWho(t, p.NS, netip.AddrPortFrom(p.addr(v6), whoPort))
			// The outside host's routed address reaches the pod directly:
			// the pod sees the client, and its ipBlock admits it.
			var conn net.Conn
			err := eventually(3*time.Second, func() error {
				return o.ns.Do(func(ns.NetNS) (err error) {
					d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: o.direct(v6).AsSlice()}}
					conn, err = d.Dial("tcp", netip.AddrPortFrom(p.addr(v6), whoPort).String())
					return err
				})
			})
			if err != nil {
				t.Fatalf("v6=%v: outside host -> pod: %v", v6, err)
			}
			got, err := ask(conn)
			conn.Close()
			if err != nil || got != o.direct(v6) {
				t.Errorf("v6=%v: the pod sees the outside client as %v (%v), want %s", v6, got, err, o.direct(v6))
			}
			// A client outside the ipBlock (another node's pod) is denied.
			if c, err := harness.DialFrom(c.nodes[0].pods[0].NS, "tcp", p.addr(v6), whoPort, time.Second); err == nil {
				c.Close()
				t.Errorf("v6=%v: a pod outside the ingress ipBlock reached the pod", v6)
			}
		}
	})

	t.Run("egress-ipblock", func(t *testing.T) {
		n := c.nodes[0]
		if err := n.WritePolicy(filepath.Join(n.Dir, "policies"), "egress.yaml", []byte(denyOutsidePolicy), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		p := n.pods[0]
		for _, v6 := range []bool{false, true} {
			if c, err := harness.DialFrom(p.NS, "tcp", o.masq(v6), whoPort, time.Second); err == nil {
				c.Close()
				t.Errorf("v6=%v: the pod reached the outside address its policy's ipBlock excepts", v6)
			}
			if got, err := seenFrom(p, "tcp", o.direct(v6)); err != nil || got != p.addr(v6) {
				t.Errorf("v6=%v: the ipBlock-allowed outside address: seen as %v (%v)", v6, got, err)
			}
		}
		// An ipBlock allowing only the masqueraded address: decided on the
		// pod's address and that destination, before the NAT.
		if err := n.WritePolicy(filepath.Join(n.Dir, "policies"), "egress.yaml", []byte(allowOutsidePolicy), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		for _, v6 := range []bool{false, true} {
			if got, err := seenFrom(p, "tcp", o.masq(v6)); err != nil || got != n.address(v6) {
				t.Errorf("v6=%v: the ipBlock-allowed masqueraded address: seen as %v (%v), want %s", v6, got, err, n.address(v6))
			}
			if c, err := harness.DialFrom(p.NS, "tcp", o.direct(v6), whoPort, time.Second); err == nil {
				c.Close()
				t.Errorf("v6=%v: the pod reached an outside address its policy does not allow", v6)
			}
		}
		// The other node's pods are not selected by its (empty) policy dir.
		if got, err := seenFrom(c.nodes[1].pods[0], "tcp", o.masq(false)); err != nil || got != c.nodes[1].address(false) {
			t.Errorf("unselected pod: seen as %v (%v)", got, err)
		}
	})
}

// farHost is a host outside the cluster behind a router whose link to it
// has a smaller MTU (1280) than the underlay's: the router answers a pod's
// full-size packets with ICMP "fragmentation needed" / "packet too big",
// addressed to the node's address the masquerade gave the flow. The far
// host's own MTU stays 1500, so its MSS does not hide the smaller hop.
type farHost struct {
	router, far ns.NetNS
}

const pmtu = 1280

func farAddr(v6 bool) netip.Addr {
	if v6 {
		return netip.MustParseAddr("2001:db8:ff::2")
	}
	return netip.MustParseAddr("198.18.0.2")
}

func newFarHost(t *testing.T, c *cluster) *farHost {
	t.Helper()
	f := &farHost{}
	for _, p := range []*ns.NetNS{&f.router, &f.far} {
		n, err := testutils.NewNS()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close(); _ = testutils.UnmountNS(n) })
		*p = n
	}
	addr := func(l netlink.Link, ps ...string) error {
		for _, p := range ps {
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.MustParsePrefix(p)), Flags: unix.IFA_F_NODAD}); err != nil {
				return err
			}
		}
		return netlink.LinkSetUp(l)
	}
	port := "pr-" + harness.RandomSuffix(6)
	if err := f.router.Do(func(ns.NetNS) error {
		for _, s := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(s, []byte("1"), 0o644); err != nil {
				return err
			}
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "up0", MTU: 1500}, PeerName: port, PeerNamespace: netlink.NsFd(int(c.underlay.Fd()))}); err != nil {
			return err
		}
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "far0", MTU: pmtu}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(f.far.Fd()))}); err != nil {
			return err
		}
		up, err := netlink.LinkByName("up0")
		if err != nil {
			return err
		}
		if err := addr(up, "192.0.2.254/24", "2001:db8::fe/64"); err != nil {
			return err
		}
		far, err := netlink.LinkByName("far0")
		if err != nil {
			return err
		}
		return addr(far, "198.18.0.1/24", "2001:db8:ff::1/64")
	}); err != nil {
		t.Fatalf("router: %v", err)
	}
	if err := f.far.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		// The far host's side keeps 1500: its MSS says nothing of the hop.
		if err := netlink.LinkSetMTU(l, 1500); err != nil {
			return err
		}
		if err := addr(l, farAddr(false).String()+"/24", farAddr(true).String()+"/64"); err != nil {
			return err
		}
		for _, gw := range []string{"198.18.0.1", "2001:db8:ff::1"} {
			g := netip.MustParseAddr(gw)
			dst := netip.MustParsePrefix("0.0.0.0/0")
			if g.Is6() {
				dst = netip.MustParsePrefix("::/0")
			}
			if err := netlink.RouteAdd(&netlink.Route{Dst: ipNet(dst), Gw: g.AsSlice()}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("far host: %v", err)
	}
	if err := c.bridgePort(port, c.bridge); err != nil {
		t.Fatal(err)
	}
	// The nodes reach the far network through the router.
	for _, n := range c.nodes {
		if err := n.NS.Do(func(ns.NetNS) error {
			for dst, gw := range map[string]string{"198.18.0.0/24": "192.0.2.254", "2001:db8:ff::/64": "2001:db8::fe"} {
				if err := netlink.RouteAdd(&netlink.Route{Dst: ipNet(netip.MustParsePrefix(dst)), Gw: netip.MustParseAddr(gw).AsSlice()}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: route to the far network: %v", n.Name, err)
		}
	}
	return f
}

// sink counts what each TCP connection sends until it closes its side,
// and answers with the count.
func (f *farHost) sink(t *testing.T) {
	t.Helper()
	stop, err := harness.ServeTCP(f.far, netip.AddrPortFrom(netip.IPv6Unspecified(), whoPort), func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "%d\n", n)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
}

// checkPMTU: a pod sends 2 MiB to the far host in full-size segments; only
// the router's ICMP error, translated back to the pod by the masquerade's
// conntrack entry, lets the pod lower its path MTU and finish.
func checkPMTU(t *testing.T, c *cluster) {
	f := newFarHost(t, c)
	f.sink(t)
	const size = 2 << 20
	for _, v6 := range []bool{false, true} {
		p := c.nodes[0].pods[0]
		// Generous: what is judged is the path MTU, not how soon a SYN
		// crosses a loaded machine (3 s once missed its retry).
		conn, err := harness.DialFrom(p.NS, "tcp", farAddr(v6), whoPort, 10*time.Second)
		if err != nil {
			t.Fatalf("v6=%v: dial the far host: %v", v6, err)
		}
		_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := conn.Write(make([]byte, size)); err != nil {
			t.Errorf("v6=%v: send %d bytes across the %d-byte hop: %v", v6, size, pmtu, err)
			conn.Close()
			continue
		}
		_ = conn.(*net.TCPConn).CloseWrite()
		line, err := bufio.NewReader(conn).ReadString('\n')
		conn.Close()
		if err != nil || strings.TrimSpace(line) != fmt.Sprint(size) {
			t.Errorf("v6=%v: the far host counted %q (%v), want %d", v6, strings.TrimSpace(line), err, size)
		}
		// The pod learnt the hop's MTU: the ICMP error reached it.
		var mtu int
		if err := p.NS.Do(func(ns.NetNS) error {
			rs, err := netlink.RouteGet(farAddr(v6).AsSlice())
			if err == nil && len(rs) > 0 {
				mtu = rs[0].MTU
			}
			return err
		}); err != nil || mtu != pmtu {
			t.Errorf("v6=%v: the pod's path MTU to the far host is %d (%v), want %d", v6, mtu, err, pmtu)
		}
	}
}
