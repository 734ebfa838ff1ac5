package nftdp

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// group is one identity pair in one direction, (local, remote, dir): the
// unit of a pair chain, which the writer recomputes when the engine
// touches one of its keys.
type group struct {
	local, remote identity.ID
	dir           policy.Direction
}

// allowElem is one thing a pair allows: a protocol range and a port
// range (one rule of its chain).
type allowElem struct {
	local, remote    identity.ID
	protoLo, protoHi uint8
	portLo, portHi   uint16
}

// groupElems renders the wanted keys of one group as disjoint elements:
// a key for every protocol covers everything, otherwise each protocol's
// port blocks are merged into ranges (the kernel refuses overlapping
// elements, and the engine's LPM keys may nest).
func groupElems(g group, keys []policy.Key) []allowElem {
	byProto := map[uint8][][2]uint32{}
	for _, k := range keys {
		if k.Prefix == policy.PrefixAnyProto {
			return []allowElem{keyElem(g, k)}
		}
		el := keyElem(g, k)
		byProto[k.Proto] = append(byProto[k.Proto], [2]uint32{uint32(el.portLo), uint32(el.portHi)})
	}
	var out []allowElem
	for _, proto := range slices.Sorted(mapsKeys(byProto)) {
		ranges := byProto[proto]
		slices.SortFunc(ranges, func(a, b [2]uint32) int { return cmp.Compare(a[0], b[0]) })
		cur := ranges[0]
		emit := func(r [2]uint32) {
			out = append(out, allowElem{local: g.local, remote: g.remote, protoLo: proto, protoHi: proto, portLo: uint16(r[0]), portHi: uint16(r[1])})
		}
		for _, r := range ranges[1:] {
			if r[0] <= cur[1]+1 {
				cur[1] = max(cur[1], r[1])
				continue
			}
			emit(cur)
			cur = r
		}
		emit(cur)
	}
	return out
}

// keyElem is what one key of g covers.
func keyElem(g group, k policy.Key) allowElem {
	if k.Prefix == policy.PrefixAnyProto {
		return allowElem{local: g.local, remote: g.remote, protoLo: 0, protoHi: 255, portLo: 0, portHi: 65535}
	}
	size := uint32(1) << (policy.PrefixFull - k.Prefix)
	lo := uint32(k.Port) &^ (size - 1)
	return allowElem{local: g.local, remote: g.remote, protoLo: k.Proto, protoHi: k.Proto, portLo: uint16(lo), portHi: uint16(lo + size - 1)}
}

func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// addrRange is an inclusive range of addresses of one family.
type addrRange struct{ lo, hi netip.Addr }

// lastAddr is the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// cidrRanges resolves prefixes to what the eBPF ipcache's longest-prefix
// match gives: each prefix's identity holds the prefix minus the prefixes
// in use inside it, as disjoint ranges.
func cidrRanges(prefixes map[netip.Prefix]identity.ID) map[addrRange]identity.ID {
	ps := slices.Collect(mapsKeys(prefixes))
	// Outer prefixes first, then by address: a prefix's children follow it.
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.Bits(), b.Bits())
	})
	out := map[addrRange]identity.ID{}
	for i, p := range ps {
		// p's direct children follow it in this order: prefixes inside
		// it, skipping those inside an earlier child.
		next, end := p.Masked().Addr(), lastAddr(p)
		covered := false
		for _, c := range ps[i+1:] {
			if c.Addr().Is4() != p.Addr().Is4() || !p.Contains(c.Addr()) {
				break
			}
			if covered || c.Addr().Less(next) {
				continue
			}
			if next.Less(c.Addr()) {
				out[addrRange{next, c.Addr().Prev()}] = prefixes[p]
			}
			if last := lastAddr(c); last == end {
				covered = true
			} else {
				next = last.Next()
			}
		}
		if !covered {
			out[addrRange{next, end}] = prefixes[p]
		}
	}
	return out
}

// ifnameBytes is name as the kernel's iifname/oifname: IFNAMSIZ bytes.
func ifnameBytes(name string) []byte {
	b := make([]byte, 16)
	copy(b, name)
	return b
}
