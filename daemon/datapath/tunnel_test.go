package datapath

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/daemon/routing"
)

// TestTunnelConfig: the eBPF tunnel and the VXLAN guard share cdo_tunnel
// but switch independently; peers are written before the tunnel goes on
// and removed after it goes off; both survive a restart of the daemon.
func TestTunnelConfig(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC}, true)
	read := func() (bpf.CoordinoTunnelConfig, int) {
		t.Helper()
		var cfg bpf.CoordinoTunnelConfig
		if err := c.dp.objs.CdoTunnel.Lookup(uint32(0), &cfg); err != nil {
			t.Fatal(err)
		}
		n := 0
		var (
			k bpf.CoordinoIpcacheKey
			v bpf.CoordinoTunnelPeer
		)
		for it := c.dp.objs.CdoTunnelPeers.Iterate(); it.Next(&k, &v); {
			n++
		}
		return cfg, n
	}
	want := func(when string, flags uint32, port uint16, peers int) {
		t.Helper()
		cfg, n := read()
		if cfg.Flags != flags || ntohs(cfg.Port) != port || n != peers {
			t.Fatalf("%s: flags %d port %d, %d peers; want flags %d port %d, %d peers", when, cfg.Flags, ntohs(cfg.Port), n, flags, port, peers)
		}
	}
	want("new", 0, 0, 0)
	if err := c.dp.SetVXLANGuard(routing.DefaultVXLANPort); err != nil {
		t.Fatal(err)
	}
	want("guard on", tunnelGuard, routing.DefaultVXLANPort, 0)
	tun := &Tunnel{
		Self: TunnelEndpoint{Addr: netip.MustParseAddr("192.0.2.1"), MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}},
		Port: routing.DefaultVXLANPort, VNI: 1,
		Peers: map[netip.Prefix]TunnelEndpoint{
			netip.MustParsePrefix("10.10.1.0/24"):   {Addr: netip.MustParseAddr("192.0.2.2"), MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}},
			netip.MustParsePrefix("fd00:10:1::/64"): {Addr: netip.MustParseAddr("192.0.2.2"), MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}},
		},
	}
	if err := c.dp.SetTunnel(tun); err != nil {
		t.Fatal(err)
	}
	want("tunnel on", tunnelGuard|tunnelOn, routing.DefaultVXLANPort, 2)
	if err := c.dp.Close(); err != nil {
		t.Fatal(err)
	}
	c.open()
	want("after restart", tunnelGuard|tunnelOn, routing.DefaultVXLANPort, 2)
	if err := c.dp.SetVXLANGuard(routing.DefaultVXLANPort); err != nil { // what a restarted daemon does first
		t.Fatal(err)
	}
	want("guard set again after restart", tunnelGuard|tunnelOn, routing.DefaultVXLANPort, 2)
	delete(tun.Peers, netip.MustParsePrefix("fd00:10:1::/64"))
	if err := c.dp.SetTunnel(tun); err != nil {
		t.Fatal(err)
	}
	want("a block gone", tunnelGuard|tunnelOn, routing.DefaultVXLANPort, 1)
	if err := c.dp.SetTunnel(nil); err != nil {
		t.Fatal(err)
	}
	want("tunnel off", tunnelGuard, routing.DefaultVXLANPort, 0)
	if err := c.dp.SetVXLANGuard(0); err != nil {
		t.Fatal(err)
	}
	if cfg, _ := read(); cfg.Flags != 0 {
		t.Fatalf("guard off: flags %d, want 0", cfg.Flags)
	}
	bad := &Tunnel{Self: TunnelEndpoint{Addr: netip.MustParseAddr("2001:db8::1"), MAC: tun.Self.MAC}, Port: routing.DefaultVXLANPort, VNI: 1}
	if err := c.dp.SetTunnel(bad); err == nil {
		t.Fatal("an IPv6 VTEP was accepted")
	}
	want("refused", 0, 0, 0)
}

// Addresses of the decapsulation tests: a peer node and its block.
var (
	peerNode  = netip.MustParseAddr("192.0.2.2")
	peerBlock = netip.MustParsePrefix("10.20.0.0/16")
	peerPod   = netip.MustParseAddr("10.20.0.5")
	tunnelMAC = net.HardwareAddr{2, 0, 0, 0, 0, 0xaa}
)

// tunnelCluster is a cluster whose pod b is a primary endpoint (host
// routing can deliver to it) on a node with the eBPF tunnel and the guard
// on, with one peer node. features nil probes the kernel; hostRouted says
// whether host routing took effect (the kernel has what it needs).
func tunnelCluster(t testing.TB, features *kernel.Features) (c *cluster, hostRouted bool) {
	c = newClusterWith(t, Config{AttachMode: AttachTC, Features: features}, true)
	c.makePrimary("b")
	hostRouted, err := c.dp.SetHostRouting(true)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.dp.SetPeerBlocks([]netip.Prefix{peerBlock}); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.SetRemoteNodeIPs([]netip.Addr{peerNode}); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.SetVXLANGuard(routing.DefaultVXLANPort); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.SetTunnel(&Tunnel{
		Self: TunnelEndpoint{Addr: testnet.NodeIP, MAC: tunnelMAC}, Port: routing.DefaultVXLANPort, VNI: 1,
		Peers: map[netip.Prefix]TunnelEndpoint{peerBlock: {Addr: peerNode, MAC: tunnelMAC}},
	}); err != nil {
		t.Fatal(err)
	}
	return c, hostRouted
}

// vxlanPacket is an underlay frame addressed to the test netns's loopback
// (so the stack would take it as its own): outer IPv4 UDP from src to dst
// on port, then vxlanHdr and the inner Ethernet frame.
func vxlanPacket(src, dst netip.Addr, port uint16, vxlanHdr, inner []byte) []byte {
	f := eth(etherIPv4, ipv4(src, dst, protoUDP, ip4opts{}, udp(40000, port, append(append([]byte{}, vxlanHdr...), inner...))))
	clear(f[0:6]) // the loopback's MAC
	return f
}

var vxlanVNI1 = []byte{0x08, 0, 0, 0, 0, 0, 1, 0}

// runUnderlay runs cdo_from_node on f as the loopback's ingress and
// returns the verdict and the frame as the program left it.
func runUnderlay(t testing.TB, c *cluster, f []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(f)+256)
	opts := &ebpf.RunOptions{Data: f, DataOut: out, Context: skbContext{Ifindex: 1}}
	ret, err := c.dp.objs.CdoFromNode.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, opts.DataOut
}

const actRedirect = 7 // TC_ACT_REDIRECT

// TestTunnelDecap drives cdo_from_node with VXLAN packets: one from a peer
// node carrying its pod's packet for local pod b is decapsulated and
// redirected into b, rewritten as b's veth would deliver it; any packet
// that fails a check is left untouched for the device (or, from no peer
// node, dropped by the guard). A kernel without nf_conntrack's BPF lookup
// (6.1 without the module loaded), and this one told to do without, or
// without bpf_skb_adjust_room's decapsulation flags (before 6.3), leaves
// every packet to the device and the host's path, as legacy host routing
// does.
func TestTunnelDecap(t *testing.T) {
	all := kernel.Probe()
	t.Run("kernel", func(t *testing.T) { testTunnelDecap(t, all) })
	t.Run("without-ct-lookup", func(t *testing.T) { testTunnelDecap(t, all.Without(kernel.CTLookup)) })
}

func testTunnelDecap(t *testing.T, features *kernel.Features) {
	c, hostRouted := tunnelCluster(t, features)
	if hostRouted != features.Has(kernel.CTLookup) {
		t.Fatalf("host routing on: %v, with bpf_skb_ct_lookup: %v", hostRouted, features.Has(kernel.CTLookup))
	}
	// Before 6.3 the programs cannot decapsulate: the device does.
	decaps := hostRouted && features.Has(kernel.DecapFlags)
	b := podIPs["b"]
	inner := func(src, dst netip.Addr) []byte {
		return eth(etherIPv4, ipv4(src, dst, protoTCP, ip4opts{ttl: 9}, tcp(1234, 80, tcpSYN)))
	}
	f := vxlanPacket(peerNode, testnet.NodeIP, routing.DefaultVXLANPort, vxlanVNI1, inner(peerPod, b))
	ret, out := runUnderlay(t, c, f)
	switch want := inner(peerPod, b); {
	case !decaps:
		if ret != actPass || !bytes.Equal(out, f) {
			t.Fatalf("peer pod -> b without eBPF decapsulation: verdict %d (frame changed: %v), want pass (%d), untouched", ret, !bytes.Equal(out, f), actPass)
		}
	case ret != actRedirect:
		t.Fatalf("peer pod -> b: verdict %d, want redirect (%d)", ret, actRedirect)
	default:
		copy(want[0:6], c.eps["b"].PodMAC)
		copy(want[6:12], c.eps["b"].HostMAC)
		want[14+8] = 8 // TTL decremented; the program fixed the checksum, which want does not hold
		if len(out) != len(want) || !bytes.Equal(out[:14+8], want[:14+8]) || !bytes.Equal(out[14+12:], want[14+12:]) {
			t.Fatalf("decapsulated frame\n% x\nwant\n% x", out, want)
		}
	}
	for _, tc := range []struct {
		name string
		f    []byte
		want uint32
	}{
		{"another VNI", vxlanPacket(peerNode, testnet.NodeIP, routing.DefaultVXLANPort, []byte{0x08, 0, 0, 0, 0, 0, 2, 0}, inner(peerPod, b)), actPass},
		{"no VNI flag", vxlanPacket(peerNode, testnet.NodeIP, routing.DefaultVXLANPort, []byte{0, 0, 0, 0, 0, 0, 1, 0}, inner(peerPod, b)), actPass},
		{"another port", vxlanPacket(peerNode, testnet.NodeIP, routing.DefaultVXLANPort+1, vxlanVNI1, inner(peerPod, b)), actPass},
		{"inner source in no peer block", vxlanPacket(peerNode, testnet.NodeIP, routing.DefaultVXLANPort, vxlanVNI1, inner(podIPs["ext"], b)), actPass},
		{"inner destination no local pod", vxlanPacket(peerNode, testnet.NodeIP, routing.DefaultVXLANPort, vxlanVNI1, inner(peerPod, netip.MustParseAddr("10.99.0.1"))), actPass},
		{"truncated inner packet", vxlanPacket(peerNode, testnet.NodeIP, routing.DefaultVXLANPort, vxlanVNI1, inner(peerPod, b)[:30]), actPass},
		{"from no peer node", vxlanPacket(netip.MustParseAddr("192.0.2.77"), testnet.NodeIP, routing.DefaultVXLANPort, vxlanVNI1, inner(peerPod, b)), actShot},
	} {
		ret, out := runUnderlay(t, c, tc.f)
		if ret != tc.want {
			t.Errorf("%s: verdict %d, want %d", tc.name, ret, tc.want)
		}
		if ret == actPass && !bytes.Equal(out, tc.f) {
			t.Errorf("%s: passed on to the device changed", tc.name)
		}
	}
}

// FuzzTunnelDecapNeverFailsOpen: VXLAN from a peer node with arbitrary
// VXLAN header and inner frame, towards a node whose pod b denies all
// ingress. Nothing may be redirected into b, and what is passed on to the
// device must be untouched. `go test` runs the seeds; `make fuzz` explores.
func FuzzTunnelDecapNeverFailsOpen(f *testing.F) {
	c, _ := tunnelCluster(f, nil)
	c.policies(denyAllServer)
	b := podIPs["b"]
	f.Add(vxlanVNI1, eth(etherIPv4, ipv4(peerPod, b, protoTCP, ip4opts{}, tcp(1, 80, tcpSYN))))
	f.Add(vxlanVNI1, eth(etherIPv4, ipv4(peerPod, b, protoUDP, ip4opts{}, udp(1, 53, []byte{1}))))
	f.Add(vxlanVNI1, eth(etherIPv6, ipv6(netip.MustParseAddr("fd00:20::5"), podIPs6["b"], protoTCP, 64, tcp(1, 80, tcpSYN))))
	f.Add(vxlanVNI1, eth(etherIPv4, ipv4(peerPod, b, protoTCP, ip4opts{frag: 0x2000}, tcp(1, 80, tcpSYN))))
	f.Fuzz(func(t *testing.T, hdr, inner []byte) {
		// BPF_PROG_TEST_RUN refuses frames over a page less the skb's head-
		// and tailroom (3,712 bytes on x86-64); the programs read headers.
		hdr, inner = hdr[:min(len(hdr), 64)], inner[:min(len(inner), 2048)]
		in := vxlanPacket(peerNode, testnet.NodeIP, routing.DefaultVXLANPort, hdr, inner)
		ret, out := runUnderlay(t, c, in)
		if ret == actRedirect {
			t.Fatalf("fail-open: redirected into b, which denies all ingress: % x", in)
		}
		if ret == actPass && !bytes.Equal(out, in) {
			t.Fatalf("passed on changed:\n% x\nfrom\n% x", out, in)
		}
	})
}

// TestTunnelPeersMapFull: peers that do not fit are counted, and the
// tunnel is not turned on with some missing; turned off (what the daemon
// does then), the device carries everything: no peer is left in the map.
func TestTunnelPeersMapFull(t *testing.T) {
	c := hostRoutedCluster(t)
	vtep := TunnelEndpoint{Addr: peerNode, MAC: tunnelMAC}
	tun := &Tunnel{Self: TunnelEndpoint{Addr: testnet.NodeIP, MAC: tunnelMAC}, Port: routing.DefaultVXLANPort, VNI: 1,
		Peers: map[netip.Prefix]TunnelEndpoint{
			netip.MustParsePrefix("10.20.1.0/24"): vtep, netip.MustParsePrefix("10.20.2.0/24"): vtep, netip.MustParsePrefix("10.20.3.0/24"): vtep,
		}}
	err := c.dp.SetTunnel(tun)
	var full *MapFullError
	if !errors.As(err, &full) || full.Map != bpf.CoordinoMapCdoTunnelPeers {
		t.Fatalf("three peers into two: got %v, want a MapFullError of cdo_tunnel_peers", err)
	}
	if n := c.refusals(bpf.CoordinoMapCdoTunnelPeers); n != 1 {
		t.Errorf("refusals counted: %v, want 1", n)
	}
	var cfg bpf.CoordinoTunnelConfig
	if err := c.dp.objs.CdoTunnel.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Flags&tunnelOn != 0 {
		t.Fatal("tunnel turned on with a peer missing")
	}
	if err := c.dp.SetTunnel(nil); err != nil {
		t.Fatal(err)
	}
	var (
		k bpf.CoordinoIpcacheKey
		v bpf.CoordinoTunnelPeer
	)
	if c.dp.objs.CdoTunnelPeers.Iterate().Next(&k, &v) {
		t.Errorf("peer %v left with the tunnel off", k)
	}
}
