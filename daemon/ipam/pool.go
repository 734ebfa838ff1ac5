package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
)

// Pool is the node's set of blocks, safe for concurrent use. A pod gets one
// address per address family the pool serves (both families → dual-stack).
// Blocks can change at runtime (SetBlocks): the pool never forgets an
// address in use, even one outside every block it holds, so no address is
// handed out twice while blocks come and go.
type Pool struct {
	mu     sync.Mutex
	blocks []*Block
	// outside holds addresses in use that lie in no block (restored before
	// their block arrived, or a block taken away while still in use). A
	// block added later absorbs the ones it contains.
	outside map[netip.Addr]bool
	// free and capacity count the addresses of serving blocks per family
	// (index famIndex), so an allocation checks the low-water mark in O(1).
	free, capacity [2]int
	// low receives a non-blocking kick when an allocation leaves a family
	// below its low-water mark (see LowWater).
	low chan struct{}
	// dynamic is set once blocks come from the cluster (SetBlocks): a full
	// node then gets a new block instead of staying full.
	dynamic bool
}

// BlockSpec is one block the node should hold.
type BlockSpec struct {
	Prefix netip.Prefix
	// Releasing blocks keep their addresses but hand out no new ones.
	Releasing bool
}

// NewPool builds a pool from the node's CIDRs; at most one per family would
// be usual, but several are allowed and filled in order.
func NewPool(cidrs []netip.Prefix) (*Pool, error) {
	p := &Pool{outside: map[netip.Addr]bool{}, low: make(chan struct{}, 1)}
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
	p.recountLocked()
	return p, nil
}

// SetBlocks makes specs the node's blocks. New blocks start serving (and
// take over addresses in use that they contain); listed blocks follow their
// Releasing flag; blocks no longer listed stop serving and are dropped once
// their last address is released. Invalid or overlapping specs are skipped
// and reported in the error; the valid rest is applied.
func (p *Pool) SetBlocks(specs []BlockSpec) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dynamic = true
	defer p.recountLocked()
	var errs []error
	want := map[netip.Prefix]BlockSpec{}
	var order []netip.Prefix
	for _, s := range specs {
		if !s.Prefix.IsValid() {
			errs = append(errs, fmt.Errorf("block %v: invalid prefix", s.Prefix))
			continue
		}
		c := s.Prefix.Masked()
		if _, dup := want[c]; dup {
			continue
		}
		if i := slices.IndexFunc(order, c.Overlaps); i >= 0 {
			errs = append(errs, fmt.Errorf("block %v overlaps block %v: ignored", c, order[i]))
			continue
		}
		want[c] = s
		order = append(order, c)
	}
	kept := p.blocks[:0]
	for _, b := range p.blocks {
		s, listed := want[b.prefix]
		switch {
		case listed && s.Releasing:
			b.state = Releasing
		case listed:
			b.state = Serving
		default:
			b.state = Removed
		}
		delete(want, b.prefix)
		if b.state == Removed && b.nUsed == 0 {
			continue
		}
		kept = append(kept, b)
	}
	p.blocks = kept
	for _, c := range order {
		s, isNew := want[c]
		if !isNew {
			continue
		}
		if b := p.overlapping(c); b != nil {
			// A removed block still in use, overlapping a new one: keep the
			// old one's bookkeeping until it drains; the new one waits.
			errs = append(errs, fmt.Errorf("block %v overlaps %v, which still has addresses in use: not added yet", c, b.prefix))
			continue
		}
		b, err := NewBlock(c)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if s.Releasing {
			b.state = Releasing
		}
		for a := range p.outside {
			if !b.Contains(a) {
				continue
			}
			if err := b.Reserve(a); err != nil {
				errs = append(errs, fmt.Errorf("address in use %v: %w", a, err))
				continue
			}
			delete(p.outside, a)
		}
		p.blocks = append(p.blocks, b)
	}
	return errors.Join(errs...)
}

func (p *Pool) overlapping(c netip.Prefix) *Block {
	for _, b := range p.blocks {
		if b.prefix.Overlaps(c) {
			return b
		}
	}
	return nil
}

// Empty reports whether the pool has no blocks (a chained-only node).
func (p *Pool) Empty() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.blocks) == 0
}

// Families reports which address families the pool serves: those of the
// blocks the node holds (serving or releasing).
func (p *Pool) Families() (v4, v6 bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.familiesLocked()
}

func (p *Pool) familiesLocked() (v4, v6 bool) {
	for _, b := range p.blocks {
		if b.state == Removed {
			continue
		}
		if b.prefix.Addr().Is4() {
			v4 = true
		} else {
			v6 = true
		}
	}
	return v4, v6
}

// Allocate returns one address per family, all or nothing. When a family's
// serving blocks are merely full the error wraps ErrFull: a transient state
// (a top-up or a pod leaving ends it), unlike a family with no serving block.
func (p *Pool) Allocate() ([]netip.Prefix, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v4, v6 := p.familiesLocked()
	if !v4 && !v6 {
		return nil, fmt.Errorf("%w: the node has no pod address block (standalone: --pod-cidr; Kubernetes: NodeConfig spec.blocks)", ErrExhausted)
	}
	var out []netip.Prefix
	for _, fam := range []struct{ is4, served bool }{{true, v4}, {false, v6}} {
		if !fam.served {
			continue
		}
		found := false
		for _, b := range p.blocks {
			if b.prefix.Addr().Is4() != fam.is4 || b.state != Serving {
				continue
			}
			a, err := b.Allocate()
			if err != nil {
				continue
			}
			p.free[famIndex(fam.is4)]--
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			found = true
			break
		}
		if !found {
			p.releaseLocked(out)
			return nil, p.noFreeLocked(fam.is4)
		}
	}
	for _, fam := range []bool{true, false} {
		if i := famIndex(fam); p.capacity[i] > 0 && p.free[i] < lowWater(p.capacity[i]) {
			select {
			case p.low <- struct{}{}:
			default: // a kick is already pending: the reader coalesces
			}
		}
	}
	return out, nil
}

// noFreeLocked explains why a served family has no address to hand out.
func (p *Pool) noFreeLocked(is4 bool) error {
	i := famIndex(is4)
	if p.capacity[i] == 0 {
		return fmt.Errorf("%w: every %s block of the node is being released", ErrExhausted, familyName(is4))
	}
	next := "addresses free up as pods leave (or grow --pod-cidr)"
	if p.dynamic {
		next = "a new block is being requested from the cluster, retry later"
	}
	var blocks []string
	for _, b := range p.blocks {
		if b.state == Serving && b.prefix.Addr().Is4() == is4 {
			blocks = append(blocks, b.prefix.String())
		}
	}
	return fmt.Errorf("%w (%s %s: %d of %d addresses in use); %s",
		ErrFull, familyName(is4), strings.Join(blocks, ", "), p.capacity[i]-p.free[i], p.capacity[i], next)
}

// lowWater is the number of free addresses of a family below which the
// node's usage should reach the controller without waiting for the regular
// status interval. The controller tops up below its --min-free-addresses
// (default 16), which the daemon does not know: a quarter of the family's
// serving capacity covers larger settings on big blocks, and the floor of
// 16 covers the default on small ones. Reporting early costs one status
// write; reporting late leaves the node full.
func lowWater(capacity int) int {
	return max(16, capacity/4)
}

// LowWater receives a value when an allocation left a family below its
// low-water mark. Kicks coalesce (the channel holds one); the pod path never
// blocks on it.
func (p *Pool) LowWater() <-chan struct{} { return p.low }

func famIndex(is4 bool) int {
	if is4 {
		return 0
	}
	return 1
}

// recountLocked recomputes the serving free and capacity counts; block
// states only change in SetBlocks, which calls it.
func (p *Pool) recountLocked() {
	p.free, p.capacity = [2]int{}, [2]int{}
	for _, b := range p.blocks {
		if b.state == Serving {
			i := famIndex(b.prefix.Addr().Is4())
			p.free[i] += b.Free()
			p.capacity[i] += b.size
		}
	}
}

func familyName(is4 bool) string {
	if is4 {
		return "IPv4"
	}
	return "IPv6"
}

// Reserve marks addresses as used (state rebuild). An address outside every
// block is remembered, and taken over by a block that arrives later. Every
// address that can be reserved is; the others (not assignable in their
// block, or already in use) are returned with an error naming each.
func (p *Pool) Reserve(addrs []netip.Prefix) (rejected []netip.Prefix, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, a := range addrs {
		b := p.blockFor(a.Addr())
		switch {
		case b == nil && p.outside[a.Addr()]:
			err = fmt.Errorf("address %v is already in use", a.Addr())
		case b == nil:
			p.outside[a.Addr()] = true
			continue
		default:
			err = b.Reserve(a.Addr())
			if err == nil && b.state == Serving {
				p.free[famIndex(a.Addr().Is4())]--
			}
		}
		if err != nil {
			errs = append(errs, err)
			rejected = append(rejected, a)
		}
	}
	return rejected, errors.Join(errs...)
}

// Release frees addresses; unknown ones are ignored, so it is idempotent.
func (p *Pool) Release(addrs []netip.Prefix) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(addrs)
}

func (p *Pool) releaseLocked(addrs []netip.Prefix) {
	drained := false
	for _, a := range addrs {
		delete(p.outside, a.Addr())
		if b := p.blockFor(a.Addr()); b != nil {
			if b.state == Serving && b.InUse(a.Addr()) {
				p.free[famIndex(a.Addr().Is4())]++
			}
			b.Release(a.Addr())
			drained = drained || (b.state == Removed && b.nUsed == 0)
		}
	}
	if drained {
		p.blocks = slices.DeleteFunc(p.blocks, func(b *Block) bool { return b.state == Removed && b.nUsed == 0 })
	}
}

// InUse reports whether a is allocated.
func (p *Pool) InUse(a netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.outside[a] {
		return true
	}
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
	State      BlockState
}

// Usage reports every block's fill, in the order blocks were added.
func (p *Pool) Usage() []Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Usage, 0, len(p.blocks))
	for _, b := range p.blocks {
		out = append(out, Usage{Prefix: b.prefix, Used: b.nUsed, Size: b.size, State: b.state})
	}
	return out
}

// Outside returns the addresses in use that lie in no block of the node.
func (p *Pool) Outside() []netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]netip.Addr, 0, len(p.outside))
	for a := range p.outside {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// CanServe reports whether the node can hand out addresses at all, and if
// not why: every family it serves needs a serving block. Full blocks do not
// count against it; they are transient (the controller tops the node up,
// pods leave), and ADD reports them itself with a retryable error.
func (p *Pool) CanServe() (bool, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	v4, v6 := p.familiesLocked()
	if !v4 && !v6 {
		return false, "no pod address block"
	}
	for _, fam := range []struct{ is4, served bool }{{true, v4}, {false, v6}} {
		if fam.served && p.capacity[famIndex(fam.is4)] == 0 {
			return false, "every " + familyName(fam.is4) + " block is being released"
		}
	}
	return true, ""
}
