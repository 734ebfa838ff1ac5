package ipam

import (
	"fmt"
	"net/netip"
	"sync"
)

// Pool is the node's set of blocks, safe for concurrent use. A pod gets one
// address per address family the pool has (both families → dual-stack).
type Pool struct {
	mu     sync.Mutex
	blocks []*Block
}

// NewPool builds a pool from the node's CIDRs; at most one per family would
// be usual, but several are allowed and filled in order.
func NewPool(cidrs []netip.Prefix) (*Pool, error) {
	p := &Pool{}
	seen := map[netip.Prefix]bool{}
	for _, c := range cidrs {
		c = c.Masked()
		if seen[c] {
			continue
		}
		for _, b := range p.blocks {
			if b.prefix.Overlaps(c) {
				return nil, fmt.Errorf("pod CIDR %v overlaps %v", c, b.prefix)
			}
		}
		seen[c] = true
		b, err := NewBlock(c)
		if err != nil {
			return nil, err
		}
		p.blocks = append(p.blocks, b)
	}
	return p, nil
}

// Empty reports whether the pool has no blocks (a chained-only node).
func (p *Pool) Empty() bool { return len(p.blocks) == 0 }

// Families reports which address families the pool serves.
func (p *Pool) Families() (v4, v6 bool) {
	for _, b := range p.blocks {
		if b.prefix.Addr().Is4() {
			v4 = true
		} else {
			v6 = true
		}
	}
	return v4, v6
}

// Allocate returns one address per family, all or nothing.
func (p *Pool) Allocate() ([]netip.Prefix, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.blocks) == 0 {
		return nil, fmt.Errorf("%w: the daemon has no pod CIDR (start it with --pod-cidr for primary mode)", ErrExhausted)
	}
	var out []netip.Prefix
	for _, is4 := range []bool{true, false} {
		var lastErr error
		found, served := false, false
		for _, b := range p.blocks {
			if b.prefix.Addr().Is4() != is4 {
				continue
			}
			served = true
			a, err := b.Allocate()
			if err != nil {
				lastErr = err
				continue
			}
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			found = true
			break
		}
		if served && !found {
			p.releaseLocked(out)
			return nil, lastErr
		}
	}
	return out, nil
}

// Reserve marks addresses as used (state rebuild). Addresses outside every
// block are ignored: they belong to a block this node no longer has.
func (p *Pool) Reserve(addrs []netip.Prefix) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range addrs {
		if b := p.blockFor(a.Addr()); b != nil {
			if err := b.Reserve(a.Addr()); err != nil {
				return err
			}
		}
	}
	return nil
}

// Release frees addresses; unknown ones are ignored, so it is idempotent.
func (p *Pool) Release(addrs []netip.Prefix) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(addrs)
}

func (p *Pool) releaseLocked(addrs []netip.Prefix) {
	for _, a := range addrs {
		if b := p.blockFor(a.Addr()); b != nil {
			b.Release(a.Addr())
		}
	}
}

// InUse reports whether a is allocated.
func (p *Pool) InUse(a netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.blockFor(a)
	return b != nil && b.InUse(a)
}

// Contains reports whether a belongs to one of the pool's blocks.
func (p *Pool) Contains(a netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blockFor(a) != nil
}

func (p *Pool) blockFor(a netip.Addr) *Block {
	for _, b := range p.blocks {
		if b.Contains(a) {
			return b
		}
	}
	return nil
}

// Usage is a snapshot of one block.
type Usage struct {
	Prefix     netip.Prefix
	Used, Size int
}

// Usage reports every block's fill.
func (p *Pool) Usage() []Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Usage, 0, len(p.blocks))
	for _, b := range p.blocks {
		out = append(out, Usage{Prefix: b.prefix, Used: b.nUsed, Size: b.size})
	}
	return out
}

// CanAllocate reports whether Allocate would succeed now, and if not why.
func (p *Pool) CanAllocate() (bool, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.blocks) == 0 {
		return false, "no pod CIDR configured"
	}
	for _, is4 := range []bool{true, false} {
		served, free := false, false
		for _, b := range p.blocks {
			if b.prefix.Addr().Is4() == is4 {
				served = true
				free = free || b.Free() > 0
			}
		}
		if served && !free {
			fam := "IPv6"
			if is4 {
				fam = "IPv4"
			}
			return false, "every " + fam + " block is exhausted"
		}
	}
	return true, ""
}
