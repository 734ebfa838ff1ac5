package masquerade

import (
	"net/netip"
	"slices"
	"testing"
)

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestSpans(t *testing.T) {
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name string
		in   []netip.Prefix
		v6   bool
		want []span
	}{
		{"blocks inside their pool merge", pfx("10.10.1.0/24", "10.10.0.0/16", "10.10.2.0/24"), false, []span{{a("10.10.0.0"), a("10.11.0.0")}}},
		{"adjacent merge", pfx("10.0.1.0/24", "10.0.0.0/24"), false, []span{{a("10.0.0.0"), a("10.0.2.0")}}},
		{"apart stay apart, sorted", pfx("192.0.2.7/32", "10.0.0.0/8"), false, []span{{a("10.0.0.0"), a("11.0.0.0")}, {a("192.0.2.7"), a("192.0.2.8")}}},
		{"host bits ignored", pfx("10.1.2.3/16"), false, []span{{a("10.1.0.0"), a("10.2.0.0")}}},
		{"top of the space has no end", pfx("255.255.255.0/24", "0.0.0.0/0"), false, []span{{a("0.0.0.0"), netip.Addr{}}}},
		{"other family left out", pfx("10.0.0.0/8", "fd00::/64"), true, []span{{a("fd00::"), a("fd00:0:0:1::")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := spans(tc.in, tc.v6); !slices.Equal(got, tc.want) {
				t.Fatalf("spans(%v) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func TestDiff(t *testing.T) {
	old := spans(pfx("10.0.0.0/24", "10.0.5.0/24"), false)
	now := spans(pfx("10.0.0.0/24", "10.0.7.0/24"), false)
	if got := diff(old, now); len(got) != 1 || got[0].start != netip.MustParseAddr("10.0.5.0") {
		t.Fatalf("gone = %v, want 10.0.5.0/24 only", got)
	}
	if got := diff(now, old); len(got) != 1 || got[0].start != netip.MustParseAddr("10.0.7.0") {
		t.Fatalf("added = %v, want 10.0.7.0/24 only", got)
	}
}
