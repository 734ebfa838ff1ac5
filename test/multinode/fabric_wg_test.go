//go:build fabric

// Built with the fabric tag (make test-fabric): about 20 s.

package multinode

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/wireguard"
)

// bgpWG: blocks announced over BGP, pod traffic through WireGuard (the
// userspace device: this kernel may lack the module).
var bgpWG = mode{name: "bgp-wireguard", routing: "bgp", encryption: "wireguard", overhead: 80, wgKind: wireguard.KindUserspace}

// TestFabricBGPWireGuard: the fabric with --encryption=wireguard (the
// userspace device). The router learns every node's blocks over BGP and
// routes the tunnel's endpoints between the racks; pod traffic across
// racks reaches every pod in both families and crosses the router only as
// WireGuard's UDP, and no node installs a learned route over a block the
// tunnel carries.
func TestFabricBGPWireGuard(t *testing.T) {
	f := newFabricWith(t, bgpWG, 3, 0, false)
	start := time.Now()
	if err := eventually(30*time.Second, func() error {
		for _, v6 := range []bool{false, true} {
			tbl, err := f.routerTable(v6)
			if err != nil {
				return err
			}
			for _, n := range f.nodes {
				b := n.blocks()[b2i(v6)]
				if rs := tbl[b.String()]; len(rs) == 0 || !rs[0].Valid {
					return fmt.Errorf("router: no valid route to %s (%s)", b, n.Name)
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("every block in the router %v after the pods were up", time.Since(start).Round(time.Millisecond))
	t.Run("pods-across-racks", func(t *testing.T) { checkReachability(t, f.cluster) })
	t.Run("no-learned-route-over-tunnelled-blocks", func(t *testing.T) {
		for _, n := range f.nodes {
			krs, err := kernelRoutes(n)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range f.nodes {
				for _, b := range o.blocks() {
					if r, ok := krs[b]; ok {
						t.Errorf("%s installed the learned %v: %s's pods would be reached in clear", n.Name, r, o.Name)
					}
				}
			}
			if !n.LogContains("which WireGuard carries encrypted") {
				t.Errorf("%s's log does not say why the peers' blocks were not installed", n.Name)
			}
		}
	})
	t.Run("encrypted-through-the-router", f.checkEncryptedAcrossRacks)
}

// checkEncryptedAcrossRacks captures every frame in the router's
// namespace while node0's pod sends a marker to node2's (the other rack)
// in both families: the marker never appears, and the pair's traffic is
// UDP between the two nodes' fabric addresses.
func (f *fabric) checkEncryptedAcrossRacks(t *testing.T) {
	n0, n2 := f.nodes[0], f.nodes[2]
	uc := startCapture(t, f.cluster)
	for _, v6 := range []bool{false, true} {
		conn, err := dialEcho(n0.pods[0], n2.pods[0].addr(v6))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 10; i++ {
			_, _ = conn.Write(plaintextMarker)
			buf := make([]byte, len(plaintextMarker))
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := conn.Read(buf); err != nil {
				t.Fatalf("marker echo: %v", err)
			}
		}
		conn.Close()
	}
	uc.stopFn()
	pair := map[netip.Addr]bool{n0.fabricAddr(false): true, n0.fabricAddr(true): true, n2.fabricAddr(false): true, n2.fabricAddr(true): true}
	uc.mu.Lock()
	defer uc.mu.Unlock()
	tunnel := 0
	for _, fr := range uc.frames {
		if bytes.Contains(fr, plaintextMarker) {
			t.Fatalf("the marker crossed the router in clear: %x", fr)
		}
		if src, dst, udp := ipPair(fr); udp && pair[src] && pair[dst] {
			tunnel++
		}
	}
	if tunnel < 20 {
		t.Fatalf("only %d UDP frames between node0 and node2 of %d captured: the capture saw no tunnel", tunnel, len(uc.frames))
	}
	t.Logf("%d frames captured in the router, %d tunnel UDP between the racks, no marker", len(uc.frames), tunnel)
}

// ipPair is an Ethernet frame's IP source and destination, and whether it
// carries UDP.
func ipPair(f []byte) (src, dst netip.Addr, udp bool) {
	if len(f) < 14 {
		return
	}
	ip := f[14:]
	switch binary.BigEndian.Uint16(f[12:14]) {
	case unix.ETH_P_IP:
		if len(ip) >= 20 {
			return netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])), ip[9] == unix.IPPROTO_UDP
		}
	case unix.ETH_P_IPV6:
		if len(ip) >= 40 {
			return netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40])), ip[6] == unix.IPPROTO_UDP
		}
	}
	return
}
