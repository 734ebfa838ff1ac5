package masquerade

import (
	"net/netip"
	"slices"
)

// span is the address range [start, end); an invalid end runs to the top
// of the family's address space.
type span struct{ start, end netip.Addr }

// spans merges prefixes of one family (v6 or not) into sorted,
// non-overlapping, non-adjacent ranges: the only shape an nftables interval
// set accepts, and a canonical one, so two configurations compare span by
// span.
func spans(prefixes []netip.Prefix, v6 bool) []span {
	var in []span
	for _, p := range prefixes {
		if !p.IsValid() || p.Addr().Is6() != v6 || p.Addr().Is4In6() {
			continue
		}
		p = p.Masked()
		in = append(in, span{p.Addr(), lastOf(p).Next()})
	}
	slices.SortFunc(in, func(a, b span) int { return a.start.Compare(b.start) })
	var out []span
	for _, s := range in {
		if n := len(out); n > 0 {
			last := &out[n-1]
			if !last.end.IsValid() {
				continue // the last span already runs to the top
			}
			if s.start.Compare(last.end) <= 0 {
				if !s.end.IsValid() || s.end.Compare(last.end) > 0 {
					last.end = s.end
				}
				continue
			}
		}
		out = append(out, s)
	}
	return out
}

// lastOf is the highest address of p.
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// diff returns the spans of a that b lacks.
func diff(a, b []span) []span {
	var out []span
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}
