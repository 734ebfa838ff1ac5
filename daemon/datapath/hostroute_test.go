package datapath

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/kernel"
)

// localEps reads cdo_local_eps as address -> entry.
func localEps(t *testing.T, d *Datapath) map[netip.Addr]bpf.CoordinoLocalEp {
	t.Helper()
	out := map[netip.Addr]bpf.CoordinoLocalEp{}
	var (
		k bpf.CoordinoLocalEpKey
		v bpf.CoordinoLocalEp
	)
	it := d.objs.CdoLocalEps.Iterate()
	for it.Next(&k, &v) {
		a := netip.AddrFrom16(k.Addr)
		if k.Family == 4 {
			a = netip.AddrFrom4([4]byte(k.Addr[:4]))
		}
		out[a] = v
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The host routing entries of an endpoint: written for a primary endpoint
// (both MACs known) only, kept by a re-attach without MACs (the daemon's
// reconcile after a restart) and across a restart, removed on detach.
func TestHostRoutingEntries(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC}, true)
	if got := localEps(t, c.dp); len(got) != 0 {
		t.Fatalf("endpoints without MACs (chained) got host routing entries: %v", got)
	}
	hostMAC, podMAC := net.HardwareAddr{2, 0, 0, 0, 0, 1}, net.HardwareAddr{2, 0, 0, 0, 0, 2}
	ep := c.eps["b"]
	ep.HostMAC, ep.PodMAC = hostMAC, podMAC
	if err := c.dp.AttachEndpoint(ep); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		got := localEps(t, c.dp)
		if len(got) != len(ep.IPs) {
			t.Fatalf("%s: %d host routing entries, want one per address of b (%v): %v", when, len(got), ep.IPs, got)
		}
		for _, ip := range ep.IPs {
			e, ok := got[ip]
			if !ok || e.Ifindex != uint32(ep.HostIfIndex) || net.HardwareAddr(e.PodMac[:]).String() != podMAC.String() ||
				net.HardwareAddr(e.HostMac[:]).String() != hostMAC.String() {
				t.Fatalf("%s: entry of %v = %+v (present %v), want ifindex %d, pod %s, host %s", when, ip, e, ok, ep.HostIfIndex, podMAC, hostMAC)
			}
		}
	}
	check("attached")
	if err := c.dp.AttachEndpoint(c.eps["b"]); err != nil { // no MACs: as after a restart
		t.Fatal(err)
	}
	check("re-attached without MACs")
	if err := c.dp.Close(); err != nil {
		t.Fatal(err)
	}
	c.open()
	c.policies()
	check("after restart")
	if err := c.dp.AttachEndpoint(c.eps["b"]); err != nil {
		t.Fatal(err)
	}
	check("reconciled after restart")
	if err := c.dp.DetachEndpoint(ep); err != nil {
		t.Fatal(err)
	}
	if got := localEps(t, c.dp); len(got) != 0 {
		t.Fatalf("host routing entries left after detach: %v", got)
	}
}

// peerBlocks reads cdo_peer_blocks.
func peerBlocks(t *testing.T, d *Datapath) map[bpf.CoordinoIpcacheKey]bool {
	t.Helper()
	out := map[bpf.CoordinoIpcacheKey]bool{}
	var (
		k bpf.CoordinoIpcacheKey
		v uint32
	)
	it := d.objs.CdoPeerBlocks.Iterate()
	for it.Next(&k, &v) {
		out[k] = true
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// SetPeerBlocks writes what changed: blocks come and go with peers, a
// restarted daemon adopts the pinned set (removing what its first peer set
// lacks), and an entry changed behind its back is not re-read per call
// (the map is the daemon's alone; re-reading it on every peer change would
// cost a walk of every node's blocks).
func TestSetPeerBlocks(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC}, true)
	p := netip.MustParsePrefix
	expect := func(when string, want ...netip.Prefix) {
		t.Helper()
		got := peerBlocks(t, c.dp)
		if len(got) != len(want) {
			t.Fatalf("%s: %d peer blocks, want %v", when, len(got), want)
		}
		for _, b := range want {
			if !got[ipcacheKey(b)] {
				t.Fatalf("%s: %v missing from %d peer blocks", when, b, len(got))
			}
		}
	}
	a, b, v6 := p("10.20.1.0/26"), p("10.20.2.0/26"), p("fd00:20:2::/112")
	if err := c.dp.SetPeerBlocks([]netip.Prefix{a, b, v6}); err != nil {
		t.Fatal(err)
	}
	expect("three blocks", a, b, v6)
	if err := c.dp.SetPeerBlocks([]netip.Prefix{b, v6}); err != nil {
		t.Fatal(err)
	}
	expect("a peer left", b, v6)

	if err := c.dp.Close(); err != nil {
		t.Fatal(err)
	}
	c.open()
	c.policies()
	expect("after restart, before the first peer set", b, v6)
	if err := c.dp.SetPeerBlocks([]netip.Prefix{a, b}); err != nil {
		t.Fatal(err)
	}
	expect("first peer set after restart", a, b)

	// Written behind the datapath's back: SetPeerBlocks trusts its copy.
	k := ipcacheKey(v6)
	if err := c.dp.objs.CdoPeerBlocks.Update(&k, uint32(0), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.SetPeerBlocks([]netip.Prefix{a, b}); err != nil {
		t.Fatal(err)
	}
	expect("unchanged peer set: the map is not walked again", a, b, v6)
}

// Device hooks whose interface is gone lose their pins, and a tunnel hook
// is detached once no tunnel is kept (host routing off, or no VXLAN).
// Kernels without tcx (before 6.6) get cls_bpf filters instead, pruned
// the same way.
func TestPruneDeviceHooks(t *testing.T) {
	all := kernel.Probe()
	t.Run("tcx", func(t *testing.T) {
		if !all.Has(kernel.TCX) {
			t.Skip("the kernel has no tcx (docs/kernels.md)")
		}
		testPruneDeviceHooks(t, all)
	})
	t.Run("tc", func(t *testing.T) { testPruneDeviceHooks(t, all.Without(kernel.TCX)) })
}

func testPruneDeviceHooks(t *testing.T, features *kernel.Features) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, Features: features}, false)
	links := filepath.Join(c.cfg.BPFDir, "links")
	present := func(dir string) bool {
		_, err := os.Stat(filepath.Join(links, dir))
		return err == nil
	}
	// The test process has a network namespace of its own: fixed names.
	newDevice := func(name string) (string, int) {
		t.Helper()
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			t.Fatal(err)
		}
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netlink.LinkDel(l) })
		return name, l.Attrs().Index
	}
	tunnelProgs := func(ifindex int) int {
		t.Helper()
		if !features.Has(kernel.TCX) {
			l, err := netlink.LinkByIndex(ifindex)
			if err != nil {
				t.Fatal(err)
			}
			filters, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
			if err != nil && !errors.Is(err, unix.EINVAL) {
				t.Fatal(err)
			}
			return len(filters)
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Programs)
	}

	tunnel, tunnelIndex := newDevice("hooktunnel")
	node, nodeIndex := newDevice("hooknode")
	if err := c.dp.AttachTunnelDevice(tunnel, tunnelIndex); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.AttachNodeDevice(node, nodeIndex, false); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.PruneDeviceHooks(tunnel); err != nil {
		t.Fatal(err)
	}
	if !present("tunnel-"+tunnel) || !present("node-"+node) {
		t.Fatal("hooks of interfaces that are there were removed")
	}
	l, err := netlink.LinkByName(node)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(l); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.PruneDeviceHooks(tunnel); err != nil {
		t.Fatal(err)
	}
	if present("node-" + node) {
		t.Error("the hooks of a deleted interface kept their pins")
	}
	if !present("tunnel-" + tunnel) {
		t.Error("the kept tunnel's hook was removed")
	}

	if tunnelProgs(tunnelIndex) != 1 {
		t.Fatalf("%d programs on the tunnel's ingress, want host routing's", tunnelProgs(tunnelIndex))
	}
	if err := c.dp.PruneDeviceHooks(""); err != nil {
		t.Fatal(err)
	}
	if present("tunnel-"+tunnel) || tunnelProgs(tunnelIndex) != 0 {
		t.Errorf("tunnel hook not detached when no tunnel is kept: pinned %v, %d programs", present("tunnel-"+tunnel), tunnelProgs(tunnelIndex))
	}
}

// hostRoutedCluster is a cluster with host routing on and tiny host
// routing maps: two local addresses, two peer blocks, two tunnel peers.
// Pod b is a primary endpoint (host routing can deliver to it).
func hostRoutedCluster(t *testing.T) *cluster {
	c := newClusterWith(t, Config{AttachMode: AttachTC, testCapacities: map[string]uint32{
		bpf.CoordinoMapCdoLocalEps: 2, bpf.CoordinoMapCdoPeerBlocks: 2, bpf.CoordinoMapCdoTunnelPeers: 2}}, false)
	c.makePrimary("b")
	if _, err := c.dp.SetHostRouting(true); err != nil {
		t.Fatal(err)
	}
	return c
}

// makePrimary re-attaches pod name with MACs, as a primary endpoint.
func (c *cluster) makePrimary(name string) {
	c.t.Helper()
	ep := c.eps[name]
	ep.HostMAC, ep.PodMAC = net.HardwareAddr{2, 0, 0, 0, 0xb, 1}, net.HardwareAddr{2, 0, 0, 0, 0xb, 2}
	if err := c.dp.AttachEndpoint(ep); err != nil {
		c.t.Fatal(err)
	}
	c.eps[name] = ep
}

// hostRouted reports whether cdo_from_node redirects a TCP SYN from src
// (another node's pod) to local pod to; else it must pass untouched, to
// the host's forwarding path.
func (c *cluster) hostRouted(src netip.Addr, to string) bool {
	c.t.Helper()
	f := eth(etherIPv4, ipv4(src, c.pods[to].IP, protoTCP, ip4opts{ttl: 9}, tcp(1234, 80, tcpSYN)))
	clear(f[0:6]) // the loopback's MAC: addressed to this host
	ret, out := runUnderlay(c.t, c, f)
	if ret == actPass && !bytes.Equal(out, f) {
		c.t.Errorf("%s -> %s: passed on changed", src, to)
	}
	if ret != actPass && ret != actRedirect {
		c.t.Errorf("%s -> %s: verdict %d, want pass or redirect", src, to, ret)
	}
	return ret == actRedirect
}

// TestPeerBlocksMapFull: blocks that do not fit are counted and take the
// host's path; which ones fit is the same at every call (longest prefix
// first, then by address), and a peer set that fits again is complete.
func TestPeerBlocksMapFull(t *testing.T) {
	c := hostRoutedCluster(t)
	p := netip.MustParsePrefix
	b1, b2, b3 := p("10.20.1.0/24"), p("10.20.2.0/24"), p("10.20.3.0/24")
	for round := 1; round <= 2; round++ {
		err := c.dp.SetPeerBlocks([]netip.Prefix{b3, b2, b1})
		var full *MapFullError
		if !errors.As(err, &full) || full.Map != bpf.CoordinoMapCdoPeerBlocks || !strings.Contains(err.Error(), "1 of 3 entries not in place") {
			t.Fatalf("round %d: three blocks into two: got %v, want a MapFullError of cdo_peer_blocks for one entry", round, err)
		}
		if got := peerBlocks(t, c.dp); len(got) != 2 || !got[ipcacheKey(b1)] || !got[ipcacheKey(b2)] {
			t.Fatalf("round %d: peer blocks %v, want %v and %v", round, got, b1, b2)
		}
		if n := c.refusals(bpf.CoordinoMapCdoPeerBlocks); n != float64(round) {
			t.Errorf("round %d: refusals counted: %v", round, n)
		}
	}
	if !c.hostRouted(netip.MustParseAddr("10.20.1.5"), "b") {
		t.Error("pod of a block that fits not host-routed")
	}
	if c.hostRouted(netip.MustParseAddr("10.20.3.5"), "b") {
		t.Error("pod of the block that does not fit host-routed")
	}
	if err := c.dp.SetPeerBlocks([]netip.Prefix{b1, b3}); err != nil {
		t.Fatalf("two blocks, one of them new: %v", err)
	}
	if !c.hostRouted(netip.MustParseAddr("10.20.3.5"), "b") {
		t.Error("pod of the block that fits now not host-routed")
	}
}

// TestLocalEpsMapFull: a primary endpoint whose address does not fit the
// host routing map is attached all the same, counted, and reached through
// the host's path.
func TestLocalEpsMapFull(t *testing.T) {
	c := hostRoutedCluster(t)
	if err := c.dp.SetPeerBlocks([]netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}); err != nil {
		t.Fatal(err)
	}
	c.makePrimary("a") // b and a fill it
	c.makePrimary("c")
	if n := c.refusals(bpf.CoordinoMapCdoLocalEps); n != 1 {
		t.Errorf("refusals counted: %v, want 1", n)
	}
	if got := localEps(t, c.dp); len(got) != 2 {
		t.Errorf("host routing entries %v, want a's and b's", got)
	}
	peer := netip.MustParseAddr("10.20.0.5")
	if !c.hostRouted(peer, "b") {
		t.Error("b not host-routed")
	}
	if c.hostRouted(peer, "c") {
		t.Error("c host-routed without an entry")
	}
	c.expect(true, "a>c tcp/80")
}

// TestDeviceHookTCRepointed: on a kernel without tcx, a node device hook
// re-attached with another program (the device became an L3 tunnel, or a
// new daemon brought new programs) runs the new one, and its marker pins
// the new one, not the program it replaced, which would stay loaded.
func TestDeviceHookTCRepointed(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, Features: kernel.Probe().Without(kernel.TCX)}, false)
	const name = "hookrepoint"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		t.Fatal(err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(l) })
	progID := func(p *ebpf.Program) ebpf.ProgramID {
		t.Helper()
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		return id
	}
	marker := filepath.Join(c.cfg.BPFDir, "links", "node-"+name, "ingress"+tcMarker+strconv.Itoa(l.Attrs().Index))
	for _, l3 := range []bool{false, true, true} {
		if err := c.dp.AttachNodeDevice(name, l.Attrs().Index, l3); err != nil {
			t.Fatal(err)
		}
		want := progID(c.dp.objs.CdoFromNode)
		if l3 {
			want = progID(c.dp.objs.CdoFromNodeL3)
		}
		filters, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
		if err != nil || len(filters) != 1 {
			t.Fatalf("l3 %v: filters %v (%v), want one", l3, filters, err)
		}
		if got := filters[0].(*netlink.BpfFilter).Id; ebpf.ProgramID(got) != want {
			t.Errorf("l3 %v: filter runs program %d, want %d", l3, got, want)
		}
		pinned, err := ebpf.LoadPinnedProgram(marker, nil)
		if err != nil {
			t.Fatalf("l3 %v: marker: %v", l3, err)
		}
		if got := progID(pinned); got != want {
			t.Errorf("l3 %v: marker pins program %d, want %d", l3, got, want)
		}
		pinned.Close()
	}
}
