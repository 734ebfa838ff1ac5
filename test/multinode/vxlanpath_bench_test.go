//go:build benchmultinode

package multinode

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/test/harness"
)

// TestBenchVXLANPath takes the vxlan mode's gap to the underlay apart in
// one two-node cluster: every path is interleaved with the bare underlay
// between the same node namespaces (same congestion control on both
// sides), so the machine's load hits both alike. Paths: Coordino's pod ->
// pod; the same with the pod programs detached from both host veths, and
// with GRO (NAPI) on both ends of both veths; node -> remote pod (no
// sending veth; only with COORDINO_BENCH_NODE_ROW set); and a kernel-only
// twin built in the same node namespaces (plain veth pods, an `ip link add
// type vxlan nolearning` device on another VNI and port, static routes, no
// BPF), whose plain pods also run over Coordino's device and route. Asserts nothing (go test -tags benchmultinode -run
// TestBenchVXLANPath).
func TestBenchVXLANPath(t *testing.T) {
	c := newCluster(t, vxlan, 2)
	n0, n1 := c.nodes[0].NS, c.nodes[1].NS
	a0, a1 := c.addPod(c.nodes[0]), c.addPod(c.nodes[1])
	b0, b1 := c.addPod(c.nodes[0]), c.addPod(c.nodes[1])
	detachPodPrograms(t, b0)
	detachPodPrograms(t, b1)
	// GRO on both ends of a pair's veths puts the veth in NAPI mode: the
	// receiving side is polled and aggregated instead of queued per packet.
	g0, g1 := c.addPod(c.nodes[0]), c.addPod(c.nodes[1])
	for _, p := range []*pod{g0, g1} {
		inNode(t, p.node.NS, "ethtool", "-K", hostVeth(t, p), "gro", "on")
		inNode(t, p.NS, "ethtool", "-K", "eth0", "gro", "on")
	}
	tw0, tw1, twAddr := kernelTwin(t, c)
	tc0, tc1, tcAddr := twinOverCoordino(t, c)
	for _, n := range c.nodes[:1] {
		t.Logf("%s:\n%s", n.Name, inNode(t, n.NS, "ip", "-d", "link", "show"))
	}
	under := c.nodes[1].address(false)
	streams := envInt("COORDINO_BENCH_STREAMS", 1)
	type path struct {
		name     string
		from, to ns.NetNS
		addr     netip.Addr
		args     []string
		got, ref []float64
	}
	// COORDINO_BENCH_CC=cubic (or bbr, ...) adds paths with that congestion
	// control on both sides to the machine's default one.
	ccs := [][]string{nil}
	if cc := os.Getenv("COORDINO_BENCH_CC"); cc != "" {
		ccs = append(ccs, []string{"-C", cc})
	}
	var paths []*path
	for _, cc := range ccs {
		paths = append(paths,
			&path{name: "Coordino pod -> pod", from: a0.NS, to: a1.NS, addr: a1.addr(false), args: cc},
			&path{name: "Coordino pod -> pod, pod programs detached", from: b0.NS, to: b1.NS, addr: b1.addr(false), args: cc},
			&path{name: "kernel twin pod -> pod", from: tw0, to: tw1, addr: twAddr, args: cc},
			&path{name: "twin's plain pods over coordino-vxlan", from: tc0, to: tc1, addr: tcAddr, args: cc},
			&path{name: "Coordino pod -> pod, GRO on the pod veths", from: g0.NS, to: g1.NS, addr: g1.addr(false), args: cc})
		if os.Getenv("COORDINO_BENCH_NODE_ROW") != "" {
			paths = append(paths, &path{name: "node -> Coordino pod", from: n0, to: a1.NS, addr: a1.addr(false), args: cc})
		}
	}
	// Every round visits every path (underlay, then the path), so a change
	// of the machine's load during the run reaches all paths alike.
	for i := 0; i < benchRounds(); i++ {
		for _, p := range paths {
			p.ref = append(p.ref, iperf(t, n0, n1, under, streams, p.args...)/1e9)
			p.got = append(p.got, iperf(t, p.from, p.to, p.addr, streams, p.args...)/1e9)
		}
	}
	var rows []string
	for _, p := range paths {
		r := summarise(p.got, p.ref)
		rows = append(rows, fmt.Sprintf("| %s | %s | %.2f Gbit/s | %.2f Gbit/s | %.2f× | %.2f–%.2f× |", p.name, strings.Join(p.args, " "), r.got, r.ref, r.ratio, r.ratioLo, r.ratioHi))
	}
	t.Logf("\n%d interleaved rounds of %d s, %d stream(s), medians\n| path | client flags | path | underlay | ratio | ratio min–max |\n|---|---|---|---|---|---|\n%s", benchRounds(), benchSeconds(), streams, joinLines(rows))
}

// hostVeth is the node-side name of p's eth0.
func hostVeth(t *testing.T, p *pod) string {
	t.Helper()
	peer := linkAttrs(t, p.NS, "eth0").ParentIndex
	var name string
	if err := p.node.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByIndex(peer)
		if err == nil {
			name = l.Attrs().Name
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return name
}

// detachPodPrograms removes the clsact qdisc (and with it the pod
// programs) from p's host veth.
func detachPodPrograms(t *testing.T, p *pod) {
	t.Helper()
	inNode(t, p.node.NS, "tc", "qdisc", "del", "dev", hostVeth(t, p), "clsact")
}

// inNode runs a command in a node namespace and returns its output.
func inNode(t *testing.T, n ns.NetNS, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + n.Path(), "--"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v: %s", args, err, out)
	}
	return string(out)
}

// kernelTwin builds, inside node0 and node1, one plain pod each (veth, MTU
// 1450, static routes) joined by a VXLAN device made as an operator would
// with iproute2 (VNI 99, port 8999, nolearning, static FDB and neighbour),
// and returns the two pods and the second one's address.
func kernelTwin(t *testing.T, c *cluster) (ns.NetNS, ns.NetNS, netip.Addr) {
	t.Helper()
	dev := "tvx" + harness.RandomSuffix(6)
	pods := plainPods(t, c, 99)
	var macs [2]string
	for i, n := range c.nodes[:2] {
		inNode(t, n.NS, "ip", "link", "add", dev, "mtu", "1450", "type", "vxlan", "id", "99", "dstport", "8999",
			"local", n.address(false).String(), "nolearning")
		inNode(t, n.NS, "ip", "addr", "add", fmt.Sprintf("10.98.0.%d/24", i+1), "dev", dev)
		inNode(t, n.NS, "ip", "link", "set", dev, "up")
		if err := n.NS.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(dev)
			if err == nil {
				macs[i] = l.Attrs().HardwareAddr.String()
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range c.nodes[:2] {
		o := 1 - i
		inNode(t, n.NS, "bridge", "fdb", "append", macs[o], "dev", dev, "dst", c.nodes[o].address(false).String())
		inNode(t, n.NS, "ip", "neigh", "replace", fmt.Sprintf("10.98.0.%d", o+1), "lladdr", macs[o], "dev", dev, "nud", "permanent")
		inNode(t, n.NS, "ip", "route", "add", fmt.Sprintf("10.99.%d.0/24", o), "via", fmt.Sprintf("10.98.0.%d", o+1), "dev", dev)
	}
	return pods[0], pods[1], netip.MustParseAddr("10.99.1.2")
}

// twinOverCoordino is kernelTwin's plain pods (on 10.97.0.0/16) routed
// through Coordino's own VXLAN device, the way Coordino routes a peer's
// block (IPv4 via the peer VTEP's IPv6 link-local address): the device and
// route without Coordino's veths and programs.
func twinOverCoordino(t *testing.T, c *cluster) (ns.NetNS, ns.NetNS, netip.Addr) {
	t.Helper()
	pods := plainPods(t, c, 97)
	for i, n := range c.nodes[:2] {
		var via string
		if err := n.NS.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("coordino-vxlan")
			if err != nil {
				return err
			}
			neighs, err := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_V6)
			if err != nil {
				return err
			}
			for _, nb := range neighs {
				if nb.IP.IsLinkLocalUnicast() {
					via = nb.IP.String()
				}
			}
			return nil
		}); err != nil || via == "" {
			t.Fatalf("%s: no peer VTEP on coordino-vxlan: %v", n.Name, err)
		}
		inNode(t, n.NS, "ip", "route", "add", fmt.Sprintf("10.97.%d.0/24", 1-i), "via", "inet6", via, "dev", "coordino-vxlan")
	}
	return pods[0], pods[1], netip.MustParseAddr("10.97.1.2")
}

// plainPods makes one pod per node of the first two: a veth pair (MTU
// 1450) with 10.<net>.<node>.2 in the pod, .1 on the node, and a default
// route; nothing else.
func plainPods(t *testing.T, c *cluster, net8 int) [2]ns.NetNS {
	t.Helper()
	var pods [2]ns.NetNS
	for i, n := range c.nodes[:2] {
		p, err := testutils.NewNS()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close(); _ = testutils.UnmountNS(p) })
		pods[i] = p
		hostName := "tw" + harness.RandomSuffix(8)
		if err := n.NS.Do(func(ns.NetNS) error {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostName, MTU: 1450}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(p.Fd()))}
			if err := netlink.LinkAdd(v); err != nil {
				return err
			}
			l, err := netlink.LinkByName(hostName)
			if err != nil {
				return err
			}
			a, _ := netlink.ParseAddr(fmt.Sprintf("10.%d.%d.1/24", net8, i))
			if err := netlink.AddrAdd(l, a); err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		}); err != nil {
			t.Fatal(err)
		}
		if err := p.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			_ = netlink.LinkSetMTU(l, 1450)
			a, _ := netlink.ParseAddr(fmt.Sprintf("10.%d.%d.2/24", net8, i))
			if err := netlink.AddrAdd(l, a); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
			lo, _ := netlink.LinkByName("lo")
			_ = netlink.LinkSetUp(lo)
			return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(fmt.Sprintf("10.%d.%d.1", net8, i))})
		}); err != nil {
			t.Fatal(err)
		}
	}
	return pods
}
