package multinode

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/harness"
)

// plaintextMarker is sent pod to pod during the capture: finding it on the
// underlay would mean cleartext.
var plaintextMarker = []byte("COORDINO-PLAINTEXT-MARKER-7f3a")

// underlayCapture reads every frame of the underlay namespace (all bridge
// ports, both directions) through an AF_PACKET socket.
type underlayCapture struct {
	fd     int
	mu     sync.Mutex
	frames [][]byte
	done   chan struct{}
	stopFn func()
}

func startCapture(t *testing.T, c *cluster) *underlayCapture {
	t.Helper()
	uc := &underlayCapture{done: make(chan struct{})}
	if err := c.underlay.Do(func(ns.NetNS) error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		uc.fd = fd
		return err
	}); err != nil {
		t.Fatalf("AF_PACKET socket: %v", err)
	}
	// Bursts of GSO frames must not overflow the default buffer.
	_ = unix.SetsockoptInt(uc.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
	tv := unix.Timeval{Usec: 100000}
	_ = unix.SetsockoptTimeval(uc.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	stop := make(chan struct{})
	go func() {
		defer close(uc.done)
		buf := make([]byte, 65536)
		stopping := false
		for {
			if !stopping {
				select {
				case <-stop:
					stopping = true // drain what is queued, then return
				default:
				}
			}
			n, _, err := unix.Recvfrom(uc.fd, buf, 0)
			if err != nil || n <= 0 {
				// Only a receive timeout means the queue is empty; EINTR
				// (Go's preemption signal) does not.
				if stopping && errors.Is(err, unix.EAGAIN) {
					return
				}
				continue
			}
			uc.mu.Lock()
			uc.frames = append(uc.frames, bytes.Clone(buf[:n]))
			uc.mu.Unlock()
		}
	}()
	var once sync.Once
	uc.stopFn = func() { once.Do(func() { close(stop); <-uc.done }) }
	t.Cleanup(func() { uc.stopFn(); unix.Close(uc.fd) })
	return uc
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// check sends the marker across nodes, stops the capture and asserts every
// IP frame seen was UDP between node addresses (bar neighbour discovery).
// Without encryption it asserts the opposite, the marker in clear: the
// control that shows the capture sees pod traffic at all.
func (uc *underlayCapture) check(t *testing.T, c *cluster) {
	for _, v6 := range []bool{false, true} {
		conn, err := dialEcho(c.nodes[0].pods[0], c.nodes[1].pods[0].addr(v6))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = conn.Write(plaintextMarker)
		buf := make([]byte, len(plaintextMarker))
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Read(buf); err != nil {
			t.Fatalf("marker echo: %v", err)
		}
		conn.Close()
	}
	uc.stopFn()
	nodeAddrs := map[netip.Addr]bool{}
	for _, n := range c.nodes {
		nodeAddrs[n.address(false)], nodeAddrs[n.address(true)] = true, true
	}
	uc.mu.Lock()
	defer uc.mu.Unlock()
	if c.mode.encryption != "wireguard" {
		for _, f := range uc.frames {
			if bytes.Contains(f, plaintextMarker) {
				if want := outerHeader(c.mode); !bytes.HasPrefix(f[12:], want) {
					t.Fatalf("marker frame starts % x after the MACs, want % x (the %s encapsulation)", f[12:12+len(want)], want, c.mode.name)
				}
				return
			}
		}
		t.Fatalf("control: %d frames captured without encryption, none with the marker", len(uc.frames))
	}
	udp := 0
	for _, f := range uc.frames {
		if bytes.Contains(f, plaintextMarker) {
			t.Fatalf("plaintext marker seen on the underlay: %x", f)
		}
		desc, ok, isUDP := classify(f, nodeAddrs)
		if !ok {
			t.Errorf("cleartext on the underlay: %s", desc)
		}
		if isUDP {
			udp++
		}
	}
	if udp < 20 {
		t.Fatalf("only %d tunnel frames captured of %d: the capture saw nothing", udp, len(uc.frames))
	}
	t.Logf("%d frames captured, %d tunnel UDP", len(uc.frames), udp)
}

// classify accepts ARP, IPv6 neighbour discovery and UDP between node
// addresses; it describes anything else.
func classify(f []byte, nodes map[netip.Addr]bool) (desc string, ok, udp bool) {
	if len(f) < 14 {
		return "runt", true, false
	}
	switch binary.BigEndian.Uint16(f[12:14]) {
	case unix.ETH_P_ARP:
		return "arp", true, false
	case unix.ETH_P_IP:
		ip := f[14:]
		if len(ip) < 20 {
			return "short IPv4", false, false
		}
		src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		desc = fmt.Sprintf("IPv4 proto %d %v -> %v", ip[9], src, dst)
		if ip[9] == unix.IPPROTO_IGMP && dst.IsMulticast() {
			return "IGMP report", true, false
		}
		return desc, ip[9] == unix.IPPROTO_UDP && nodes[src] && nodes[dst], ip[9] == unix.IPPROTO_UDP
	case unix.ETH_P_IPV6:
		ip := f[14:]
		if len(ip) < 40 {
			return "short IPv6", false, false
		}
		src, dst := netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		next := ip[6]
		desc = fmt.Sprintf("IPv6 next %d %v -> %v", next, src, dst)
		if next == unix.IPPROTO_ICMPV6 && len(ip) > 40 && ip[40] >= 133 && ip[40] <= 137 {
			return "neighbour discovery", true, false
		}
		// MLD reports travel behind a hop-by-hop header to ff02::16.
		if (next == unix.IPPROTO_HOPOPTS || next == unix.IPPROTO_ICMPV6) && dst.IsLinkLocalMulticast() {
			return "MLD report", true, false
		}
		return desc, next == unix.IPPROTO_UDP && nodes[src] && nodes[dst], next == unix.IPPROTO_UDP
	}
	return fmt.Sprintf("ethertype %#x", binary.BigEndian.Uint16(f[12:14])), false, false
}

func dialEcho(from *pod, addr netip.Addr) (net.Conn, error) {
	return harness.DialFrom(from.NS, "tcp", addr, echoPort, 3*time.Second)
}

// outerHeader is how a pod packet must start on the underlay (ethertype and
// IP version nibble): direct carries the pod's IPv4 packet itself (the
// marker goes over IPv4 first), vxlan an outer packet of the underlay family.
func outerHeader(m mode) []byte {
	if m.routing == "vxlan" && m.v6Underlay {
		return []byte{0x86, 0xdd, 0x60}
	}
	return []byte{0x08, 0x00, 0x45}
}
