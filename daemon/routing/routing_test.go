package routing

import (
	"net/netip"
	"testing"

	"github.com/coordino/coordino/daemon/peers"
)

func TestVTEPAddressesAreStableUnicastAndDistinct(t *testing.T) {
	a, b := vtepMAC("node-a"), vtepMAC("node-b")
	if a.String() != vtepMAC("node-a").String() {
		t.Fatal("MAC not stable")
	}
	if a.String() == b.String() {
		t.Fatal("two nodes share a MAC")
	}
	if a[0]&0x01 != 0 || a[0]&0x02 == 0 {
		t.Fatalf("MAC %v is not locally administered unicast", a)
	}
	ll := vtepLinkLocal(a)
	if !ll.IsLinkLocalUnicast() {
		t.Fatalf("%v is not link-local", ll)
	}
	// EUI-64: the universal/local bit flipped back, ff:fe in the middle.
	b16 := ll.As16()
	if b16[8] != a[0]^0x02 || b16[11] != 0xff || b16[12] != 0xfe || b16[15] != a[5] {
		t.Fatalf("%v is not the EUI-64 address of %v", ll, a)
	}
}

func TestPodMTUOverhead(t *testing.T) {
	for _, c := range []struct {
		mode          string
		encrypted, v6 bool
		want          int
	}{
		{Direct, false, false, 0},
		{Direct, false, true, 0},
		{VXLAN, false, false, 50},
		{VXLAN, false, true, 70},
		{VXLAN, true, false, 80},
		{Direct, true, true, 80},
	} {
		if got := PodMTUOverhead(c.mode, c.encrypted, c.v6); got != c.want {
			t.Errorf("%s encrypted=%v v6=%v: %d, want %d", c.mode, c.encrypted, c.v6, got, c.want)
		}
	}
}

func TestUnderlayIsV6OnlyWithoutIPv4(t *testing.T) {
	v4 := netip.MustParseAddr("192.0.2.1")
	v6 := netip.MustParseAddr("2001:db8::1")
	for _, c := range []struct {
		addrs []netip.Addr
		want  bool
	}{{nil, false}, {[]netip.Addr{v4}, false}, {[]netip.Addr{v4, v6}, false}, {[]netip.Addr{v6}, true}} {
		if got := UnderlayIsV6(&peers.Node{Name: "n", Addresses: c.addrs}); got != c.want {
			t.Errorf("%v: %v, want %v", c.addrs, got, c.want)
		}
	}
	if UnderlayIsV6(nil) {
		t.Error("unknown self: want IPv4")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{Mode: "bgp"}, {Mode: Direct, VNI: 1 << 24}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := (&Config{Device: "wg0"}).Validate(); err != nil {
		t.Errorf("device mode: %v", err)
	}
}
