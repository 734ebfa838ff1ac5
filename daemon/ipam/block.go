package ipam

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"
)

// MaxBlockAddresses caps the bitmap of one block. Larger blocks (an IPv6 /64)
// hand out only their first MaxBlockAddresses addresses.
const MaxBlockAddresses = 1 << 16

// ErrExhausted is returned when a block or pool has no free address.
var ErrExhausted = errors.New("no free address")

// ErrFull wraps ErrExhausted when the node's serving blocks of a family are
// full: transient, unlike a family without a serving block.
var ErrFull = fmt.Errorf("%w: the node's blocks are full", ErrExhausted)

// Block is one CIDR with a bitmap of used addresses. Not safe for concurrent use.
type Block struct {
	prefix netip.Prefix
	first  netip.Addr // first assignable address
	size   int        // assignable addresses
	used   []uint64
	nUsed  int
	next   int // next-fit cursor: recently freed addresses are reused last
	// state is the block's place in its lifecycle inside a Pool.
	state BlockState
}

// BlockState is where a block stands in its lifecycle.
type BlockState int

const (
	// Serving blocks hand out new addresses.
	Serving BlockState = iota
	// Releasing blocks hand out nothing new; the control plane takes them
	// back once their last address is freed.
	Releasing
	// Removed blocks are no longer the node's: they only keep the
	// bookkeeping of addresses still in use and vanish when empty.
	Removed
)

// String names the state as metrics and status show it.
func (s BlockState) String() string {
	switch s {
	case Releasing:
		return "releasing"
	case Removed:
		return "removed"
	}
	return "serving"
}

// NewBlock returns an empty block for p. IPv4 blocks never hand out their
// network and broadcast addresses; IPv6 blocks skip the subnet-router anycast
// address (the first one). Blocks must leave at least one assignable address.
func NewBlock(p netip.Prefix) (*Block, error) {
	if !p.IsValid() {
		return nil, fmt.Errorf("invalid block %v", p)
	}
	p = p.Masked()
	hostBits := p.Addr().BitLen() - p.Bits()
	total := new(big.Int).Lsh(big.NewInt(1), uint(hostBits))
	reserved := int64(1) // network (v4) / subnet-router anycast (v6)
	if p.Addr().Is4() {
		reserved = 2 // plus broadcast
	}
	avail := new(big.Int).Sub(total, big.NewInt(reserved))
	if avail.Sign() <= 0 {
		return nil, fmt.Errorf("block %v is too small: no assignable address", p)
	}
	size := MaxBlockAddresses
	if avail.IsInt64() && avail.Int64() < int64(size) {
		size = int(avail.Int64())
	}
	return &Block{
		prefix: p,
		first:  p.Addr().Next(),
		size:   size,
		used:   make([]uint64, (size+63)/64),
	}, nil
}

// Prefix is the block's CIDR.
func (b *Block) Prefix() netip.Prefix { return b.prefix }

// Size is the number of assignable addresses.
func (b *Block) Size() int { return b.size }

// Used is the number of allocated addresses.
func (b *Block) Used() int { return b.nUsed }

// Free is the number of addresses still available.
func (b *Block) Free() int { return b.size - b.nUsed }

// Allocate hands out the next free address after the last one handed out.
func (b *Block) Allocate() (netip.Addr, error) {
	if b.nUsed == b.size {
		return netip.Addr{}, fmt.Errorf("%w in %v (%d of %d in use)", ErrExhausted, b.prefix, b.nUsed, b.size)
	}
	for i := 0; i < b.size; i++ {
		idx := (b.next + i) % b.size
		if !b.isSet(idx) {
			b.set(idx)
			b.next = (idx + 1) % b.size
			return b.addrAt(idx), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("%w in %v: bitmap and count disagree", ErrExhausted, b.prefix)
}

// Reserve marks a as used, for rebuilding state. It fails if a is outside the
// assignable range or already used.
func (b *Block) Reserve(a netip.Addr) error {
	idx, ok := b.index(a)
	if !ok {
		return fmt.Errorf("address %v is not assignable in block %v", a, b.prefix)
	}
	if b.isSet(idx) {
		return fmt.Errorf("address %v in block %v is already in use", a, b.prefix)
	}
	b.set(idx)
	return nil
}

// Release frees a. Releasing a free or foreign address is a no-op.
func (b *Block) Release(a netip.Addr) {
	if idx, ok := b.index(a); ok && b.isSet(idx) {
		b.used[idx/64] &^= 1 << (idx % 64)
		b.nUsed--
	}
}

// InUse reports whether a is allocated in this block.
func (b *Block) InUse(a netip.Addr) bool {
	idx, ok := b.index(a)
	return ok && b.isSet(idx)
}

// Contains reports whether a lies in the block's CIDR.
func (b *Block) Contains(a netip.Addr) bool { return b.prefix.Contains(a) }

func (b *Block) isSet(idx int) bool { return b.used[idx/64]&(1<<(idx%64)) != 0 }

func (b *Block) set(idx int) {
	b.used[idx/64] |= 1 << (idx % 64)
	b.nUsed++
}

func (b *Block) addrAt(idx int) netip.Addr {
	s := b.first.As16()
	carry := uint64(idx)
	for i := 15; i >= 0 && carry > 0; i-- {
		sum := uint64(s[i]) + carry&0xff
		s[i] = byte(sum)
		carry = carry>>8 + sum>>8
	}
	a := netip.AddrFrom16(s)
	if b.first.Is4() {
		a = a.Unmap()
	}
	return a
}

func (b *Block) index(a netip.Addr) (int, bool) {
	if !b.prefix.Contains(a) || a.Less(b.first) {
		return 0, false
	}
	x, f := a.As16(), b.first.As16()
	var diff uint64
	for i := 0; i < 16; i++ {
		if i < 8 && x[i] != f[i] {
			return 0, false // more than 2^64 apart
		}
		if i >= 8 {
			diff = diff<<8 | uint64(x[i])
		}
	}
	var fl uint64
	for i := 8; i < 16; i++ {
		fl = fl<<8 | uint64(f[i])
	}
	d := diff - fl
	if diff < fl || d >= uint64(b.size) {
		return 0, false
	}
	return int(d), true
}
