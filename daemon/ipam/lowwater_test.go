package ipam

import (
	"errors"
	"net/netip"
	"testing"
)

func kicked(p *Pool) bool {
	select {
	case <-p.LowWater():
		return true
	default:
		return false
	}
}

// TestLowWaterKick: an allocation leaving a family below its low-water mark
// (a quarter of its serving capacity, at least 16) kicks LowWater once per
// read, never blocking; allocations above the mark do not. A full family is
// ErrFull (transient) and CanServe stays true; a family whose blocks are all
// releasing is not servable.
func TestLowWaterKick(t *testing.T) {
	p, err := NewPool([]netip.Prefix{netip.MustParsePrefix("10.7.0.0/24")}) // 254 addresses, mark 63
	if err != nil {
		t.Fatal(err)
	}
	for i := range 254 - 63 {
		if _, err := p.Allocate(); err != nil {
			t.Fatal(err)
		}
		if kicked(p) {
			t.Fatalf("kick after allocation %d, with %d free (mark 63)", i+1, 254-(i+1))
		}
	}
	if _, err := p.Allocate(); err != nil || !kicked(p) {
		t.Fatalf("no kick with 62 free: err %v", err)
	}
	for range 62 {
		if _, err := p.Allocate(); err != nil {
			t.Fatal(err)
		}
	}
	if !kicked(p) || kicked(p) {
		t.Fatal("kicks while full of unread ones must coalesce to one")
	}
	_, err = p.Allocate()
	if !errors.Is(err, ErrFull) || !errors.Is(err, ErrExhausted) {
		t.Fatalf("Allocate on full blocks = %v, want ErrFull", err)
	}
	if ok, why := p.CanServe(); !ok {
		t.Fatalf("full blocks make the node unservable: %s", why)
	}

	// A new block raises capacity and free count: no kick above the mark.
	if err := p.SetBlocks([]BlockSpec{{Prefix: netip.MustParsePrefix("10.7.0.0/24")}, {Prefix: netip.MustParsePrefix("10.7.1.0/24")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Allocate(); err != nil || kicked(p) {
		t.Fatalf("kick with 253 of 508 free (err %v)", err)
	}
	// Release counts back only serving blocks; the counts must match a recount.
	p.Release([]netip.Prefix{netip.MustParsePrefix("10.7.0.1/32"), netip.MustParsePrefix("10.7.0.1/32")})
	if _, err := p.Reserve([]netip.Prefix{netip.MustParsePrefix("10.7.1.200/32")}); err != nil {
		t.Fatal(err)
	}
	free, capacity := p.free, p.capacity
	p.recountLocked()
	if free != p.free || capacity != p.capacity {
		t.Fatalf("incremental counts free %v capacity %v, recount %v %v", free, capacity, p.free, p.capacity)
	}

	if err := p.SetBlocks([]BlockSpec{{Prefix: netip.MustParsePrefix("10.7.0.0/24"), Releasing: true}, {Prefix: netip.MustParsePrefix("10.7.1.0/24"), Releasing: true}}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := p.CanServe(); ok {
		t.Fatal("every IPv4 block releasing, yet CanServe")
	}
}
