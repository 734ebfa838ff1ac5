package controller

import (
	"encoding/binary"
	"math"
	"net/netip"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// blockHolder is what the index knows about one block's IPBlock claim.
type blockHolder struct {
	node, pool, phase string
	uid               types.UID // empty while our create is in flight
}

// poolRange is one CIDR of a pool cut into blocks, with the cursor from
// which the next free block is searched.
type poolRange struct {
	prefix    netip.Prefix
	blockBits int
	count     uint64 // blocks in the range, capped at 2^62
	next      uint64
}

// blockIndex is the controller's picture of every claimed block: by
// prefix (to find free ones) and by node (to reconcile one node without a
// scan). It is fed by the IPBlock informer and by the controller's own
// writes, so a block it just claimed is never offered twice.
type blockIndex struct {
	mu     sync.Mutex
	blocks map[netip.Prefix]*blockHolder
	byNode map[string]map[netip.Prefix]struct{}
	// perPool counts claimed blocks per pool and family.
	perPool map[string]*[numFamilies]int
	ranges  map[string][]*poolRange // by pool name
}

func newBlockIndex() *blockIndex {
	return &blockIndex{
		blocks:  map[netip.Prefix]*blockHolder{},
		byNode:  map[string]map[netip.Prefix]struct{}{},
		perPool: map[string]*[numFamilies]int{},
		ranges:  map[string][]*poolRange{},
	}
}

// Family is an address family; it indexes per-family counts.
type Family int

// The families, in the order pools report them.
const (
	IPv4 Family = iota
	IPv6
	numFamilies
)

// families lists every family.
var families = [numFamilies]Family{IPv4, IPv6}

// family is the address family of p.
func family(p netip.Prefix) Family {
	if p.Addr().Is6() {
		return IPv6
	}
	return IPv4
}

// String names the family as pool status and events do.
func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// set records a claim (from the informer or our own create).
func (x *blockIndex) set(p netip.Prefix, h blockHolder) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.setLocked(p, h)
}

func (x *blockIndex) setLocked(p netip.Prefix, h blockHolder) {
	if old, ok := x.blocks[p]; ok {
		x.dropLocked(p, old)
	}
	x.blocks[p] = &h
	if x.byNode[h.node] == nil {
		x.byNode[h.node] = map[netip.Prefix]struct{}{}
	}
	x.byNode[h.node][p] = struct{}{}
	c := x.perPool[h.pool]
	if c == nil {
		c = &[numFamilies]int{}
		x.perPool[h.pool] = c
	}
	c[family(p)]++
}

func (x *blockIndex) dropLocked(p netip.Prefix, h *blockHolder) {
	delete(x.blocks, p)
	if m := x.byNode[h.node]; m != nil {
		delete(m, p)
		if len(m) == 0 {
			delete(x.byNode, h.node)
		}
	}
	if c := x.perPool[h.pool]; c != nil {
		c[family(p)]--
	}
}

// remove forgets a claim; with a uid it only forgets that very object, so a
// late delete event of an old claim cannot erase a newer claim on the block.
func (x *blockIndex) remove(p netip.Prefix, uid types.UID) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if h, ok := x.blocks[p]; ok && (uid == "" || h.uid == "" || h.uid == uid) {
		x.dropLocked(p, h)
	}
}

// unreserve drops node's in-flight reservation of p after a failed create.
// Only the reservation itself goes: the informer may have recorded the real
// claim meanwhile (a create that failed for the client can still have been
// stored), and forgetting that claim would offer its block again and leave
// the claim out of its NodeConfig.
func (x *blockIndex) unreserve(p netip.Prefix, node string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if h, ok := x.blocks[p]; ok && h.uid == "" && h.node == node {
		x.dropLocked(p, h)
	}
}

// get returns a copy of the holder of p.
func (x *blockIndex) get(p netip.Prefix) (blockHolder, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	h, ok := x.blocks[p]
	if !ok {
		return blockHolder{}, false
	}
	return *h, true
}

// ofNode returns the node's claimed blocks and their holders.
func (x *blockIndex) ofNode(node string) map[netip.Prefix]blockHolder {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make(map[netip.Prefix]blockHolder, len(x.byNode[node]))
	for p := range x.byNode[node] {
		out[p] = *x.blocks[p]
	}
	return out
}

// allocatedIn returns the pool's claimed block count per family.
func (x *blockIndex) allocatedIn(pool string) [numFamilies]int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if c := x.perPool[pool]; c != nil {
		return *c
	}
	return [numFamilies]int{}
}

// setRanges installs a pool's CIDRs (keeping the cursors of unchanged ones).
func (x *blockIndex) setRanges(pool string, prefixes []netip.Prefix, blockBits func(netip.Prefix) int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := map[netip.Prefix]*poolRange{}
	for _, r := range x.ranges[pool] {
		old[r.prefix] = r
	}
	var rs []*poolRange
	for _, p := range prefixes {
		bb := blockBits(p)
		if r, ok := old[p]; ok && r.blockBits == bb {
			rs = append(rs, r)
			continue
		}
		shift := bb - p.Bits()
		n := uint64(1) << min(shift, 62)
		rs = append(rs, &poolRange{prefix: p, blockBits: bb, count: n})
	}
	if len(rs) == 0 {
		delete(x.ranges, pool)
		return
	}
	x.ranges[pool] = rs
}

// totalIn returns how many blocks the pool holds per family, saturating.
func (x *blockIndex) totalIn(pool string) [numFamilies]uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	var t [numFamilies]uint64
	for _, r := range x.ranges[pool] {
		f := family(r.prefix)
		if t[f] > math.MaxUint64-r.count {
			t[f] = math.MaxUint64
		} else {
			t[f] += r.count
		}
	}
	return t
}

// reserve picks a free block of the family in the pool, records it as
// held by node (uid unknown until the create returns) and returns it. The
// search starts at each range's cursor, so sequential allocation is O(1)
// and a full pool costs one pass.
func (x *blockIndex) reserve(pool string, fam Family, node string) (netip.Prefix, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, r := range x.ranges[pool] {
		if family(r.prefix) != fam {
			continue
		}
		for i := uint64(0); i < r.count; i++ {
			idx := (r.next + i) % r.count
			b := nthBlock(r.prefix, r.blockBits, idx)
			if _, taken := x.blocks[b]; taken || x.overlapsLocked(b) {
				continue
			}
			r.next = (idx + 1) % r.count
			x.setLocked(b, blockHolder{node: node, pool: pool, phase: "Active"})
			return b, true
		}
	}
	return netip.Prefix{}, false
}

// overlapsLocked reports a claim of another size covering or inside b
// (blocks of pools whose block size differs, or a pool re-created with a
// new size); equal-size claims are found by the map lookup alone.
func (x *blockIndex) overlapsLocked(b netip.Prefix) bool {
	for bits := b.Bits() - 1; bits >= 0 && bits >= b.Bits()-16; bits-- {
		if _, ok := x.blocks[netip.PrefixFrom(b.Addr(), bits).Masked()]; ok {
			return true
		}
	}
	return false
}

// nthBlock returns block i (of size /bits) of prefix p.
func nthBlock(p netip.Prefix, bits int, i uint64) netip.Prefix {
	a := p.Addr()
	if a.Is4() {
		v := binary.BigEndian.Uint32(a.AsSlice()) + uint32(i)<<(32-bits)
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], v)
		return netip.PrefixFrom(netip.AddrFrom4(b), bits)
	}
	b := a.As16()
	hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	shift := uint(128 - bits)
	var addHi, addLo uint64
	if shift >= 64 {
		addHi = i << (shift - 64)
	} else {
		addLo = i << shift
		if shift > 0 {
			addHi = i >> (64 - shift)
		}
	}
	lo2 := lo + addLo
	carry := uint64(0)
	if lo2 < lo {
		carry = 1
	}
	hi += addHi + carry
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], lo2)
	return netip.PrefixFrom(netip.AddrFrom16(b), bits)
}
