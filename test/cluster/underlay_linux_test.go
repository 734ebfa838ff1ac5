package cluster

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/routing"
)

// ipv4Frame is an Ethernet frame carrying an IPv4 packet from src to dst
// of proto with payload (after a 20-byte header).
func ipv4Frame(vlan bool, src, dst string, proto byte, payload []byte) []byte {
	f := make([]byte, 12)
	if vlan {
		f = append(f, 0x81, 0x00, 0, 7)
	}
	f = append(f, 0x08, 0x00)
	ip := make([]byte, 20)
	ip[0], ip[9] = 0x45, proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	return append(append(f, ip...), payload...)
}

func udp(sport, dport uint16, payload []byte) []byte {
	h := make([]byte, 8)
	binary.BigEndian.PutUint16(h, sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	return append(h, payload...)
}

func TestClassifyFrame(t *testing.T) {
	pods := []netip.Prefix{workerPodCIDR(1), workerPodCIDR(2)}
	podTCP := ipv4Frame(false, "10.234.1.5", "10.234.2.9", unix.IPPROTO_TCP, make([]byte, 20))
	vxlan := append(make([]byte, 8), podTCP...)
	for _, tc := range []struct {
		name  string
		frame []byte
		want  frameKind
	}{
		{"pod to pod TCP", podTCP, frameCleartext},
		{"pod to pod behind a VLAN tag", ipv4Frame(true, "10.234.2.9", "10.234.1.5", unix.IPPROTO_UDP, udp(9401, 40000, nil)), frameCleartext},
		{"pod to pod in VXLAN", ipv4Frame(false, "10.233.0.11", "10.233.0.12", unix.IPPROTO_UDP, udp(40000, routing.DefaultVXLANPort, vxlan)), frameCleartext},
		{"WireGuard between nodes", ipv4Frame(false, "10.233.0.11", "10.233.0.12", unix.IPPROTO_UDP, udp(WireGuardPort, WireGuardPort, make([]byte, 32))), frameWireGuard},
		{"node to API server", ipv4Frame(false, "10.233.0.11", "10.233.0.2", unix.IPPROTO_TCP, make([]byte, 20)), frameOther},
		{"pod to a node", ipv4Frame(false, "10.234.1.5", "10.233.0.12", unix.IPPROTO_TCP, make([]byte, 20)), frameOther},
		{"ARP", append(make([]byte, 12), 0x08, 0x06, 0, 1), frameOther},
		{"truncated IPv4", ipv4Frame(false, "10.234.1.5", "10.234.2.9", 6, nil)[:20], frameOther},
		{"runt", []byte{1, 2, 3}, frameOther},
	} {
		if got, _, _ := classifyFrame(tc.frame, pods); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	if _, s, from := classifyFrame(podTCP, pods); s != "10.234.1.5 -> 10.234.2.9 proto 6" || from != 0 {
		t.Errorf("sample %q from %d, want the first range's", s, from)
	}
	// The source's range names the node that let the packet out.
	if _, _, from := classifyFrame(ipv4Frame(false, "10.234.2.9", "10.234.1.5", unix.IPPROTO_UDP, udp(9401, 40000, nil)), pods); from != 1 {
		t.Errorf("reply from the second range attributed to range %d", from)
	}
}
