package datapath

import (
	"net"
	"net/netip"
	"testing"

	"github.com/coordino/coordino/bpf"
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
	if err := c.dp.SetVXLANGuard(8472); err != nil {
		t.Fatal(err)
	}
	want("guard on", tunnelGuard, 8472, 0)
	tun := &Tunnel{
		Self: TunnelEndpoint{Addr: netip.MustParseAddr("192.0.2.1"), MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}},
		Port: 8472, VNI: 1,
		Peers: map[netip.Prefix]TunnelEndpoint{
			netip.MustParsePrefix("10.10.1.0/24"):   {Addr: netip.MustParseAddr("192.0.2.2"), MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}},
			netip.MustParsePrefix("fd00:10:1::/64"): {Addr: netip.MustParseAddr("192.0.2.2"), MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}},
		},
	}
	if err := c.dp.SetTunnel(tun); err != nil {
		t.Fatal(err)
	}
	want("tunnel on", tunnelGuard|tunnelOn, 8472, 2)
	if err := c.dp.Close(); err != nil {
		t.Fatal(err)
	}
	c.open()
	want("after restart", tunnelGuard|tunnelOn, 8472, 2)
	if err := c.dp.SetVXLANGuard(8472); err != nil { // what a restarted daemon does first
		t.Fatal(err)
	}
	want("guard set again after restart", tunnelGuard|tunnelOn, 8472, 2)
	delete(tun.Peers, netip.MustParsePrefix("fd00:10:1::/64"))
	if err := c.dp.SetTunnel(tun); err != nil {
		t.Fatal(err)
	}
	want("a block gone", tunnelGuard|tunnelOn, 8472, 1)
	if err := c.dp.SetTunnel(nil); err != nil {
		t.Fatal(err)
	}
	want("tunnel off", tunnelGuard, 8472, 0)
	if err := c.dp.SetVXLANGuard(0); err != nil {
		t.Fatal(err)
	}
	if cfg, _ := read(); cfg.Flags != 0 {
		t.Fatalf("guard off: flags %d, want 0", cfg.Flags)
	}
	bad := &Tunnel{Self: TunnelEndpoint{Addr: netip.MustParseAddr("2001:db8::1"), MAC: tun.Self.MAC}, Port: 8472, VNI: 1}
	if err := c.dp.SetTunnel(bad); err == nil {
		t.Fatal("an IPv6 VTEP was accepted")
	}
	want("refused", 0, 0, 0)
}
