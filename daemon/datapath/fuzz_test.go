package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/coordino/coordino/daemon/internal/testnet"
	"golang.org/x/sys/unix"
)

// The fuzz target and the random test drive the real programs with random
// and malformed frames to and from pod b, which is isolated both ways with
// no rule allowing anything: every frame must be dropped, except link
// control the oracle below allows. A pass it does not allow is fail-open.

const denyAllServer = `
metadata: {name: deny-all-server, namespace: default}
spec: {podSelector: {matchLabels: {app: server}}, policyTypes: [Ingress, Egress]}`

// fuzzTarget builds the cluster with b isolated both ways, no rule.
func fuzzTarget(tb testing.TB) *cluster {
	c := newClusterWith(tb, Config{AttachMode: AttachTC}, true)
	c.policies(denyAllServer)
	return c
}

// Ethertypes a fuzz input chooses from.
var fuzzEthertypes = []uint16{etherIPv4, etherIPv6, etherARP, 0x8100}

// checkNoFailOpen runs one frame through pod b's program for dir and fails
// if it passes where the oracle requires a drop.
func checkNoFailOpen(t *testing.T, c *cluster, egress bool, ethertype uint16, l3 []byte) (ran bool) {
	t.Helper()
	if touchesNode(ethertype, l3) {
		return false // the node is allowed in, by design; its flows would create state
	}
	f := eth(ethertype, l3)
	prog := c.dp.objs.CdoToEp
	if egress {
		prog = c.dp.objs.CdoFromEp
	}
	ret, err := tryProg(prog, c.eps["b"].HostIfIndex, f)
	if errors.Is(err, unix.EINVAL) {
		return false // BPF_PROG_TEST_RUN refuses frames shorter than their network header
	}
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	passed := ret == actPass
	if passed && !mayPass(egress, ethertype, l3) {
		t.Fatalf("fail-open: %s frame %x (ethertype %#04x) passed", map[bool]string{true: "egress", false: "ingress"}[egress], l3, ethertype)
	}
	return true
}

// touchesNode reports an IP packet from or to a node address.
func touchesNode(ethertype uint16, l3 []byte) bool {
	var addrs [][]byte
	switch {
	case ethertype == etherIPv4 && len(l3) >= 20:
		addrs = [][]byte{l3[12:16], l3[16:20]}
		n := testnet.NodeIP.As4()
		for _, a := range addrs {
			if bytes.Equal(a, n[:]) {
				return true
			}
		}
	case ethertype == etherIPv6 && len(l3) >= 40:
		n := testnet.NodeIP6.As16()
		return bytes.Equal(l3[8:24], n[:]) || bytes.Equal(l3[24:40], n[:])
	}
	return false
}

// mayPass is the oracle: what pod b, isolated both ways without rules and
// without tracked flows, may send or receive.
func mayPass(egress bool, ethertype uint16, l3 []byte) bool {
	b4, b6 := podIPs["b"].As4(), podIPs6["b"].As16()
	switch ethertype {
	case etherARP:
		if !egress {
			return true
		}
		ok := len(l3) >= 28 && bytes.Equal(l3[:6], []byte{0, 1, 8, 0, 6, 4})
		return ok && (bytes.Equal(l3[14:18], b4[:]) || bytes.Equal(l3[14:18], []byte{0, 0, 0, 0}))
	case etherIPv6:
	default:
		return !egress // other link-layer frames stay on the link
	}
	// IPv6 link control: ND or MLD, directly or (MLD) after hop-by-hop.
	if len(l3) < 48 || l3[0]>>4 != 6 {
		return false
	}
	src, dst := l3[8:24], l3[24:40]
	linkLocal := func(a []byte) bool { return a[0] == 0xfe && a[1]&0xc0 == 0x80 }
	unspecified := func(a []byte) bool { return bytes.Equal(a, make([]byte, 16)) }
	if !linkLocal(dst) && dst[0] != 0xff {
		return false
	}
	off, hbh := 40, false
	if l3[6] == 0 {
		if l3[40] != protoICMPv6 {
			return false
		}
		off, hbh = 40+(int(l3[41])+1)*8, true
	} else if l3[6] != protoICMPv6 {
		return false
	}
	if len(l3) < off+8 {
		return false
	}
	typ, hop := l3[off], l3[7]
	if egress && !linkLocal(src) && !unspecified(src) && !bytes.Equal(src, b6[:]) {
		return false
	}
	switch {
	case typ >= 133 && typ <= 137:
		if hop != 255 || hbh {
			return false
		}
		if !egress {
			return true
		}
		if typ == 134 || typ == 137 {
			return false
		}
		if typ == 136 {
			return len(l3) >= off+24 && (linkLocal(l3[off+8:off+24]) || bytes.Equal(l3[off+8:off+24], b6[:]))
		}
		return true
	case typ >= 130 && typ <= 132, typ == 143:
		return hop == 1 && (linkLocal(src) || unspecified(src))
	}
	return false
}

// fuzzSeeds are malformed and tricky frames: truncated headers, bad IHL,
// IPv6 extension-header chains, IPv4 protocol 58, fragments, ICMP errors
// with garbage quotes, spoofed ARP and neighbour advertisements.
func fuzzSeeds() []struct {
	egress    bool
	ethertype uint16
	l3        []byte
} {
	a4, a6, b4, b6 := podIPs["a"], podIPs6["a"], podIPs["b"], podIPs6["b"]
	tcpSyn := tcp(1234, 80, tcpSYN)
	v4 := func(src, dst netip.Addr, proto uint8, o ip4opts, l4 []byte) []byte {
		return ipv4(src, dst, proto, o, l4)
	}
	ext := func(next uint8, n int) []byte { // n chained destination-options headers, then next
		var b []byte
		for i := range n {
			nh := uint8(60)
			if i == n-1 {
				nh = next
			}
			b = append(b, nh, 0, 1, 4, 0, 0, 0, 0)
		}
		return b
	}
	var seeds []struct {
		egress    bool
		ethertype uint16
		l3        []byte
	}
	add := func(egress bool, et uint16, l3 []byte) {
		seeds = append(seeds, struct {
			egress    bool
			ethertype uint16
			l3        []byte
		}{egress, et, l3})
	}
	for _, egress := range []bool{false, true} {
		src4, dst4, src6, dst6 := a4, b4, a6, b6
		if egress {
			src4, dst4, src6, dst6 = b4, a4, b6, a6
		}
		full := v4(src4, dst4, protoTCP, ip4opts{}, tcpSyn)
		add(egress, etherIPv4, full)
		add(egress, etherIPv4, full[:30])                                           // truncated TCP
		add(egress, etherIPv4, full[:12])                                           // truncated IP
		add(egress, etherIPv4, v4(src4, dst4, protoTCP, ip4opts{ihlOv: 3}, tcpSyn)) // IHL < 5
		add(egress, etherIPv4, v4(src4, dst4, protoTCP, ip4opts{ihlOv: 15}, tcpSyn))
		add(egress, etherIPv4, v4(src4, dst4, protoICMPv6, ip4opts{ttl: 255}, icmp(135, 0, 0, b6.AsSlice())))
		add(egress, etherIPv4, v4(src4, dst4, protoUDP, ip4opts{id: 9, frag: 0x2000}, udp(53, 53, nil)))
		add(egress, etherIPv4, v4(src4, dst4, protoUDP, ip4opts{id: 9, frag: 100}, make([]byte, 40)))
		add(egress, etherIPv4, v4(src4, dst4, protoICMP, ip4opts{}, icmp(3, 4, 1400, []byte{0x45, 0, 0})))
		add(egress, etherIPv4, v4(src4, dst4, protoICMP, ip4opts{}, icmp(3, 3, 0, v4(dst4, src4, protoTCP, ip4opts{}, tcpSyn))))
		add(egress, etherIPv4, v4(src4, dst4, protoICMP, ip4opts{}, icmp(11, 0, 0, v4(dst4, src4, protoICMP, ip4opts{}, icmp(3, 1, 0, nil)))))
		add(egress, etherIPv6, ipv6(src6, dst6, protoTCP, 64, tcpSyn))
		add(egress, etherIPv6, ipv6(src6, dst6, protoTCP, 64, tcpSyn)[:44])
		add(egress, etherIPv6, ipv6(src6, dst6, 60, 64, append(ext(protoTCP, 5), tcpSyn...)))
		add(egress, etherIPv6, ipv6(src6, dst6, 60, 64, append(ext(protoTCP, 7), tcpSyn...)))       // too long a chain
		add(egress, etherIPv6, ipv6(src6, dst6, 60, 64, append(ext(0, 1), 6, 0, 0, 0, 0, 0, 0, 0))) // HBH not first
		add(egress, etherIPv6, ipv6(src6, dst6, 44, 64, []byte{protoUDP, 0, 0, 1, 0, 0, 0, 7}))
		add(egress, etherIPv6, ipv6(src6, dst6, 44, 64, []byte{protoUDP, 0, 0x10, 0, 0, 0, 0, 7, 1, 2}))
		add(egress, etherIPv6, ipv6(src6, dst6, 44, 64, []byte{44, 0, 0, 1, 0, 0, 0, 7, protoUDP, 0, 0, 1}))
		add(egress, etherIPv6, ipv6(src6, dst6, protoICMPv6, 64, icmp(1, 4, 0, []byte{0x60, 1})))
		add(egress, etherIPv6, ipv6(linkLocalA, solicitedNode(dst6), protoICMPv6, 255, icmp(135, 0, 0, dst6.AsSlice())))
		add(egress, etherIPv6, ipv6(linkLocalA, allNodes, protoICMPv6, 255, icmp(136, 0, 0, a6.AsSlice())))
		add(egress, etherIPv6, ipv6(linkLocalA, allNodes, protoICMPv6, 255, icmp(134, 0, 0, nil)))
		add(egress, etherIPv6, ipv6(src6, dst6, protoICMPv6, 255, icmp(135, 0, 0, dst6.AsSlice())))
		add(egress, etherARP, arp(2, a4, b4)[14:])
		add(egress, etherARP, arp(2, b4, a4)[14:])
		add(egress, 0x8100, append([]byte{0, 1, 8, 0}, full...))
	}
	return seeds
}

// FuzzVerdictNeverFailsOpen: `go test` runs the seeds; `make fuzz` explores.
func FuzzVerdictNeverFailsOpen(f *testing.F) {
	c := fuzzTarget(f)
	for _, s := range fuzzSeeds() {
		sel := uint8(0)
		for i, et := range fuzzEthertypes {
			if et == s.ethertype {
				sel = uint8(i)
			}
		}
		if s.egress {
			sel |= 0x80
		}
		f.Add(sel, s.l3)
	}
	f.Fuzz(func(t *testing.T, sel uint8, l3 []byte) {
		_ = checkNoFailOpen(t, c, sel&0x80 != 0, fuzzEthertypes[int(sel&0x7f)%len(fuzzEthertypes)], l3)
	})
}

// TestRandomPacketsNeverFailOpen: a bounded random run in every `go test`,
// of structured frames with random fields (random bytes alone rarely get
// past the first header check).
func TestRandomPacketsNeverFailOpen(t *testing.T) {
	c := fuzzTarget(t)
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 4000
	ran := 0
	for range n {
		egress := rng.IntN(2) == 0
		et, l3 := uint16(etherARP), randARP(rng)
		switch rng.IntN(5) {
		case 0, 1:
			et, l3 = etherIPv4, randIPv4(rng, egress)
		case 2, 3:
			et, l3 = etherIPv6, randIPv6(rng, egress)
		}
		if checkNoFailOpen(t, c, egress, et, l3) {
			ran++
		}
	}
	if ran < n/2 {
		t.Fatalf("only %d of %d frames ran", ran, n)
	}
	t.Logf("%d of %d random frames ran (others too short for BPF_PROG_TEST_RUN or to the node)", ran, n)
}

func pick[T any](rng *rand.Rand, xs ...T) T { return xs[rng.IntN(len(xs))] }

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// randL4 is a plausible or garbage L4 header for proto, possibly quoting
// another packet (ICMP errors).
func randL4(rng *rand.Rand, proto uint8, quote func() []byte) []byte {
	switch proto {
	case protoTCP:
		return tcp(uint16(rng.Uint32()), pick(rng, 80, 81, uint16(rng.Uint32())), byte(rng.Uint32()))
	case protoUDP, 132:
		return udp(uint16(rng.Uint32()), pick(rng, 53, 81, uint16(rng.Uint32())), randBytes(rng, rng.IntN(16)))
	case protoICMP, protoICMPv6:
		typ := pick(rng, 0, 3, 8, 11, 1, 2, 4, 128, 129, 130, 131, 132, 133, 134, 135, 136, 137, 143, uint8(rng.Uint32()))
		return icmp(typ, uint8(rng.IntN(5)), rng.Uint32(), quote())
	}
	return randBytes(rng, rng.IntN(24))
}

func randAddr4(rng *rand.Rand, own bool) netip.Addr {
	if own {
		return podIPs["b"]
	}
	return pick(rng, podIPs["a"], podIPs["c"], netip.MustParseAddr("203.0.113.9"), netip.IPv4Unspecified(),
		netip.MustParseAddr("255.255.255.255"), netip.AddrFrom4([4]byte(randBytes(rng, 4))))
}

func randAddr6(rng *rand.Rand, own bool) netip.Addr {
	if own {
		return pick(rng, podIPs6["b"], linkLocalA, netip.IPv6Unspecified())
	}
	return pick(rng, podIPs6["a"], linkLocalA, allNodes, mldRouters, solicitedNode(podIPs6["b"]),
		netip.IPv6Unspecified(), netip.AddrFrom16([16]byte(randBytes(rng, 16))))
}

func maybeTruncate(rng *rand.Rand, b []byte) []byte {
	if rng.IntN(4) == 0 && len(b) > 0 {
		return b[:rng.IntN(len(b))]
	}
	return b
}

func randIPv4(rng *rand.Rand, egress bool) []byte {
	src, dst := randAddr4(rng, egress && rng.IntN(4) != 0), randAddr4(rng, !egress)
	if !egress {
		src, dst = randAddr4(rng, false), podIPs["b"]
	}
	proto := pick(rng, protoTCP, protoUDP, protoICMP, protoICMPv6, 132, uint8(rng.Uint32()))
	o := ip4opts{ttl: uint8(rng.Uint32()), id: uint16(rng.Uint32())}
	if rng.IntN(4) == 0 {
		o.frag = pick(rng, 0x2000, uint16(rng.IntN(0x4000)))
	}
	if rng.IntN(8) == 0 {
		o.ihlOv = uint8(rng.IntN(16))
	}
	quote := func() []byte {
		return maybeTruncate(rng, ipv4(dst, src, pick[uint8](rng, protoTCP, protoUDP, protoICMP), ip4opts{}, tcp(uint16(rng.Uint32()), 80, tcpSYN)))
	}
	return maybeTruncate(rng, ipv4(src, dst, proto, o, randL4(rng, proto, quote)))
}

func randIPv6(rng *rand.Rand, egress bool) []byte {
	src, dst := randAddr6(rng, true), randAddr6(rng, false)
	if !egress {
		src, dst = randAddr6(rng, false), pick(rng, podIPs6["b"], allNodes, solicitedNode(podIPs6["b"]), linkLocalA)
	}
	proto := pick(rng, protoTCP, protoUDP, protoICMPv6, protoICMPv6, protoICMP, uint8(rng.Uint32()))
	payload := randL4(rng, proto, func() []byte {
		return maybeTruncate(rng, ipv6(dst, src, protoTCP, 64, tcp(uint16(rng.Uint32()), 80, tcpSYN)))
	})
	next := proto
	for range rng.IntN(4) { // extension headers, innermost first
		h := pick(rng, uint8(0), 43, 44, 60, 51, 59)
		var hdr []byte
		switch h {
		case 44:
			hdr = []byte{next, 0, 0, 0}
			binary.BigEndian.PutUint16(hdr[2:], uint16(rng.Uint32()))
			hdr = append(hdr, randBytes(rng, 4)...)
		case 51:
			hdr = append([]byte{next, 1}, randBytes(rng, 10)...)
		default:
			hdr = append([]byte{next, 0}, randBytes(rng, 6)...)
		}
		payload, next = append(hdr, payload...), h
	}
	hop := pick(rng, 1, 64, 255, uint8(rng.Uint32()))
	return maybeTruncate(rng, ipv6(src, dst, next, hop, payload))
}

func randARP(rng *rand.Rand) []byte {
	a := arp(uint16(rng.IntN(3)), randAddr4(rng, rng.IntN(2) == 0), podIPs["a"])[14:]
	if rng.IntN(4) == 0 {
		a[rng.IntN(len(a))] = byte(rng.Uint32())
	}
	return maybeTruncate(rng, a)
}
