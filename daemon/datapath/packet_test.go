package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// Frames for driving the programs through BPF_PROG_TEST_RUN. Checksums are
// left zero: the programs never read them.

const (
	etherIPv4 = 0x0800
	etherIPv6 = 0x86dd
	etherARP  = 0x0806

	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58

	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// Verdicts of the tc programs.
const (
	actPass = 0xffffffff // TC_ACT_UNSPEC
	actShot = 2          // TC_ACT_SHOT
)

func eth(ethertype uint16, l3 []byte) []byte {
	f := make([]byte, 14, 14+len(l3))
	copy(f[0:6], []byte{0x02, 0, 0, 0, 0, 1})
	copy(f[6:12], []byte{0x02, 0, 0, 0, 0, 2})
	binary.BigEndian.PutUint16(f[12:], ethertype)
	return append(f, l3...)
}

// ip4opts describes an IPv4 header; zero values are sensible defaults.
type ip4opts struct {
	ttl   uint8
	id    uint16
	frag  uint16 // flags (0x2000 more fragments) and offset in 8-byte units
	ihlOv uint8  // overrides the IHL nibble when non-zero
}

func ipv4(src, dst netip.Addr, proto uint8, o ip4opts, l4 []byte) []byte {
	h := make([]byte, 20, 20+len(l4))
	h[0] = 0x45
	if o.ihlOv != 0 {
		h[0] = 0x40 | o.ihlOv&0x0f
	}
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(l4)))
	binary.BigEndian.PutUint16(h[4:], o.id)
	binary.BigEndian.PutUint16(h[6:], o.frag)
	h[8] = o.ttl
	if h[8] == 0 {
		h[8] = 64
	}
	h[9] = proto
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	return append(h, l4...)
}

// ipv6 builds an IPv6 header; next is the first next-header value and
// payload everything after the fixed header (extension headers included).
func ipv6(src, dst netip.Addr, next, hop uint8, payload []byte) []byte {
	h := make([]byte, 40, 40+len(payload))
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(payload)))
	h[6] = next
	h[7] = hop
	s, d := src.As16(), dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return append(h, payload...)
}

// ip builds an IPv4 or IPv6 packet for src's family.
func ip(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	if src.Is4() {
		return ipv4(src, dst, proto, ip4opts{}, l4)
	}
	return ipv6(src, dst, proto, 64, l4)
}

func frame(src, dst netip.Addr, proto uint8, l4 []byte) []byte {
	if src.Is4() {
		return eth(etherIPv4, ip(src, dst, proto, l4))
	}
	return eth(etherIPv6, ip(src, dst, proto, l4))
}

func tcp(sport, dport uint16, flags uint8) []byte {
	h := make([]byte, 20)
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	h[12] = 5 << 4
	h[13] = flags
	return h
}

func udp(sport, dport uint16, payload []byte) []byte {
	h := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	binary.BigEndian.PutUint16(h[4:], uint16(8+len(payload)))
	return append(h, payload...)
}

// icmp builds an ICMP(v6) message: type, code, the 4 bytes after the
// checksum, then body (e.g. a quoted packet).
func icmp(typ, code uint8, rest uint32, body []byte) []byte {
	h := make([]byte, 8, 8+len(body))
	h[0], h[1] = typ, code
	binary.BigEndian.PutUint32(h[4:], rest)
	return append(h, body...)
}

// arp builds an Ethernet/IPv4 ARP packet with sender address spa.
func arp(op uint16, spa, tpa netip.Addr) []byte {
	a := make([]byte, 28)
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], etherIPv4)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], op)
	copy(a[8:14], []byte{0x02, 0, 0, 0, 0, 2})
	s, d := spa.As4(), tpa.As4()
	copy(a[14:], s[:])
	copy(a[24:], d[:])
	return eth(etherARP, a)
}

// skbContext is struct __sk_buff up to ifindex, the only field set.
type skbContext struct {
	_       [10]uint32
	Ifindex uint32
}

// runProg runs prog once on data as if it arrived on ifindex.
func runProg(t testing.TB, prog *ebpf.Program, ifindex int, data []byte) uint32 {
	t.Helper()
	ret, err := tryProg(prog, ifindex, data)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret
}

// tryProg is runProg reporting the kernel's refusal (EINVAL for frames
// shorter than their network header) instead of failing.
func tryProg(prog *ebpf.Program, ifindex int, data []byte) (uint32, error) {
	if len(data) < 14 {
		data = append(data, make([]byte, 14-len(data))...)
	}
	return prog.Run(&ebpf.RunOptions{Data: data, Context: skbContext{Ifindex: uint32(ifindex)}})
}

// fromPod and toPod run the endpoint programs of pod name on a frame and
// report whether it passes.
func (c *cluster) fromPod(name string, f []byte) bool {
	c.t.Helper()
	return runProg(c.t, c.dp.objs.CdoFromEp, c.eps[name].HostIfIndex, f) == actPass
}

func (c *cluster) toPod(name string, f []byte) bool {
	c.t.Helper()
	return runProg(c.t, c.dp.objs.CdoToEp, c.eps[name].HostIfIndex, f) == actPass
}
