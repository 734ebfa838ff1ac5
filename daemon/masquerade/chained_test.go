package masquerade

import (
	"net/netip"
	"testing"
)

func TestChainedNetwork(t *testing.T) {
	nodes := []netip.Addr{netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00:1::10")}
	for _, tc := range []struct {
		in, want string // want "" when nothing is added
		narrowed bool
	}{
		{"10.22.0.5/16", "10.22.0.0/16", false},
		{"10.22.0.5/32", "10.22.0.5/32", false},
		{"fd00:22::5/64", "fd00:22::/64", false},
		{"10.22.0.5/8", "10.0.0.0/8", false},
		{"10.22.0.5/7", "10.22.0.5/32", true},
		{"10.22.0.5/0", "10.22.0.5/32", true},
		{"fd00:22::5/31", "fd00:22::5/128", true},
		{"192.168.1.77/24", "192.168.1.77/32", true}, // the underlay
		{"fd00:1::77/64", "fd00:1::77/128", true},
		{"192.168.1.10/24", "", true}, // the node's own address
		{"192.168.1.10/32", "", true},
	} {
		got, narrowed, ok := ChainedNetwork(netip.MustParsePrefix(tc.in), nodes)
		if (tc.want == "") == ok || ok && got != netip.MustParsePrefix(tc.want) || (narrowed != nil) != tc.narrowed {
			t.Errorf("ChainedNetwork(%s) = %v, %v, %v; want %q, narrowed %v", tc.in, got, narrowed, ok, tc.want, tc.narrowed)
		}
	}
}
