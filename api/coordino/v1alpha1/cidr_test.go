package v1alpha1

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseCIDRCanonicalOnly(t *testing.T) {
	for _, tc := range []struct {
		in      string
		wantErr string
	}{
		{"10.244.0.0/16", ""},
		{"fd00:10:244::/56", ""},
		{"10.244.0.1/16", "host bits set"},
		{"::ffff:10.0.0.0/104", "IPv4-mapped"},
		{"10.244.0.0", "not a CIDR"},
		{"fe80::%eth0/64", "not a CIDR"},
		{"", "not a CIDR"},
	} {
		_, err := ParseCIDR("spec.cidrs[0]", tc.in)
		if tc.wantErr == "" && err != nil {
			t.Errorf("%q: %v", tc.in, err)
		}
		if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "spec.cidrs[0]")) {
			t.Errorf("%q: error %v, want one naming the field and %q", tc.in, err, tc.wantErr)
		}
	}
}

func TestPoolPrefixesChecksBlockSizeAndOverlap(t *testing.T) {
	ok := IPPoolSpec{CIDRs: []string{"10.0.0.0/24", "fd00::/120"}, BlockSizeIPv6: 120}
	if _, err := ok.Prefixes(); err != nil {
		t.Fatal(err)
	}
	for name, spec := range map[string]IPPoolSpec{
		"smaller than a block": {CIDRs: []string{"10.0.0.0/27"}},
		"overlap":              {CIDRs: []string{"10.0.0.0/16", "10.0.1.0/24"}},
		"block size range":     {CIDRs: []string{"10.0.0.0/8"}, BlockSizeIPv4: 31},
		"empty":                {},
	} {
		if _, err := spec.Prefixes(); err == nil {
			t.Errorf("%s: accepted %+v", name, spec)
		}
	}
}

func TestBlockNameIsInjectiveAndAValidName(t *testing.T) {
	seen := map[string]netip.Prefix{}
	for _, s := range []string{"10.0.0.0/26", "10.0.0.64/26", "10.0.0.0/25", "fd00::/122", "fd00::40/122", "::/122", "fd00::/64"} {
		p := netip.MustParsePrefix(s)
		n := BlockName(p)
		if q, dup := seen[n]; dup {
			t.Fatalf("%s and %s share name %s", p, q, n)
		}
		seen[n] = p
		if !validObjectName(n) {
			t.Errorf("%s: %q is not a valid object name", p, n)
		}
	}
}

// validObjectName is the DNS subdomain rule of object names.
func validObjectName(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for i, c := range s {
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && c != '-' && c != '.' {
			return false
		}
		if (i == 0 || i == len(s)-1) && !alnum {
			return false
		}
	}
	return true
}

// FuzzPoolAndNodeConfigConversion feeds arbitrary CIDR strings through the
// conversions the controller and daemon apply to IPPool and NodeConfig: no
// panic, and whatever is accepted is canonical, holds a block, does not
// overlap, and names a valid unique IPBlock.
func FuzzPoolAndNodeConfigConversion(f *testing.F) {
	f.Add("10.244.0.0/16", "fd00:10:244::/56", int32(26), int32(122))
	f.Add("10.0.0.1/24", "::ffff:1.2.3.4/128", int32(0), int32(0))
	f.Add("0.0.0.0/0", "::/0", int32(30), int32(64))
	f.Add("10.0.0.0/16", "10.0.1.0/24", int32(16), int32(126))
	f.Add("", "1.2.3.4", int32(-1), int32(200))
	f.Fuzz(func(t *testing.T, a, b string, bs4, bs6 int32) {
		pool := IPPoolSpec{CIDRs: []string{a, b}, BlockSizeIPv4: bs4, BlockSizeIPv6: bs6}
		ps, err := pool.Prefixes()
		if err == nil {
			for i, p := range ps {
				if p.Masked() != p || p.Addr().Is4In6() {
					t.Fatalf("accepted non-canonical %q as %s", pool.CIDRs[i], p)
				}
				if p.Bits() > pool.BlockSize(p.Addr().Is6()) {
					t.Fatalf("accepted %s smaller than its block size", p)
				}
			}
			if ps[0].Overlaps(ps[1]) {
				t.Fatalf("accepted overlapping %s %s", ps[0], ps[1])
			}
		}
		nc := NodeConfigSpec{Blocks: []NodeBlock{{CIDR: a, Pool: "p"}, {CIDR: b, Pool: "p"}}}
		bl, err := nc.Prefixes()
		if err == nil {
			if BlockName(bl[0]) == BlockName(bl[1]) {
				t.Fatalf("%s and %s share a block name", bl[0], bl[1])
			}
			for _, p := range bl {
				if !validObjectName(BlockName(p)) {
					t.Fatalf("invalid name %q for %s", BlockName(p), p)
				}
			}
		}
	})
}
