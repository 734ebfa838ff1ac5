package nftdp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"

	"github.com/coordino/coordino/daemon/policy"
)

// logMessage builds an NFULNL_MSG_PACKET message's data as the kernel does.
func logMessage(t testing.TB, prefix string, in, out uint32, payload []byte) []byte {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.String(nfulaPrefix, prefix)
	ae.Uint32(nfulaIfIndexIn, in)
	ae.Uint32(nfulaIfIndexOut, out)
	ae.Bytes(nfulaPayload, payload)
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{2, 0, 0x0c, 0x0d}, b...)
}

// tcp4 is an IPv4 TCP SYN's first bytes, 198.51.100.12:40000 to 198.51.100.11:80.
var tcp4 = []byte{
	0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 6, 0, 0, 198, 51, 100, 12, 198, 51, 100, 11,
	0x9c, 0x40, 0, 80, 0, 0, 0, 0,
}

func TestParseLogMessage(t *testing.T) {
	p, err := parseLogMessage(logMessage(t, logPrefix{dir: policy.Ingress, reason: reasonDenied, local: 257}.String(), 0, 7, tcp4))
	if err != nil {
		t.Fatal(err)
	}
	pfx, ok := parseLogPrefix(p.prefix)
	if !ok || pfx != (logPrefix{dir: policy.Ingress, reason: reasonDenied, local: 257}) || p.outIf != 7 {
		t.Fatalf("prefix %q -> %+v %v, out %d", p.prefix, pfx, ok, p.outIf)
	}
	h, ok := parsePacketHeader(p.payload)
	want := packetHeader{proto: 6, src: netip.MustParseAddr("198.51.100.12"), dst: netip.MustParseAddr("198.51.100.11"), sport: 40000, dport: 80}
	if !ok || h != want {
		t.Errorf("header %+v %v, want %+v", h, ok, want)
	}
}

func TestParsePacketHeaderIPv6(t *testing.T) {
	b := make([]byte, 40+8+4)
	b[0], b[6] = 0x60, ipv6DestOpts
	copy(b[8:24], netip.MustParseAddr("2001:db8::1").AsSlice())
	copy(b[24:40], netip.MustParseAddr("2001:db8::2").AsSlice())
	b[40] = 17 // the options header (8 bytes) leads to UDP
	binary.BigEndian.PutUint16(b[48:], 5353)
	binary.BigEndian.PutUint16(b[50:], 53)
	h, ok := parsePacketHeader(b)
	if !ok || h.proto != 17 || h.sport != 5353 || h.dport != 53 || h.dst != netip.MustParseAddr("2001:db8::2") {
		t.Errorf("header %+v %v", h, ok)
	}
	// A later fragment carries no ports.
	b[6], b[40] = ipv6Fragment, 17
	binary.BigEndian.PutUint16(b[42:], 8<<3)
	if h, ok := parsePacketHeader(b); !ok || h.proto != 17 || h.sport != 0 {
		t.Errorf("later fragment: %+v %v", h, ok)
	}
}

// FuzzLogMessage: an NFLOG message carries a pod's packet; nothing in it
// may make the reader panic.
func FuzzLogMessage(f *testing.F) {
	f.Add(logMessage(f, "cdo egress spoofed 256", 3, 0, tcp4))
	f.Add(logMessage(f, "cdo ingress allowed 0", 0, 4, []byte{0x60}))
	f.Add([]byte{2, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parseLogMessage(b)
		if err != nil {
			return
		}
		parseLogPrefix(p.prefix)
		parsePacketHeader(p.payload)
	})
}
