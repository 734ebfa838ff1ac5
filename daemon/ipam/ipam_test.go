package ipam

import (
	"errors"
	"net/netip"
	"testing"
)

func TestBlockIPv4SkipsNetworkAndBroadcast(t *testing.T) {
	b, err := NewBlock(netip.MustParsePrefix("10.9.0.0/29"))
	if err != nil {
		t.Fatal(err)
	}
	if b.Size() != 6 {
		t.Fatalf("size = %d, want 6", b.Size())
	}
	var got []string
	for {
		a, err := b.Allocate()
		if errors.Is(err, ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, a.String())
	}
	want := []string{"10.9.0.1", "10.9.0.2", "10.9.0.3", "10.9.0.4", "10.9.0.5", "10.9.0.6"}
	if len(got) != len(want) {
		t.Fatalf("allocated %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("allocated %v, want %v", got, want)
		}
	}
	if err := b.Reserve(netip.MustParseAddr("10.9.0.7")); err == nil {
		t.Fatal("broadcast address accepted")
	}
	if err := b.Reserve(netip.MustParseAddr("10.9.0.0")); err == nil {
		t.Fatal("network address accepted")
	}
}

func TestBlockNextFitReusesFreedAddressLast(t *testing.T) {
	b, _ := NewBlock(netip.MustParsePrefix("10.9.0.0/29"))
	a1, _ := b.Allocate()
	b.Release(a1)
	a2, _ := b.Allocate()
	if a2 == a1 {
		t.Fatalf("freed address %v handed out again at once", a1)
	}
	if b.Used() != 1 || b.InUse(a1) || !b.InUse(a2) {
		t.Fatalf("bookkeeping wrong: used=%d", b.Used())
	}
}

func TestBlockTooSmall(t *testing.T) {
	for _, c := range []string{"10.0.0.1/32", "10.0.0.0/31", "fd00::/128"} {
		if _, err := NewBlock(netip.MustParsePrefix(c)); err == nil {
			t.Errorf("NewBlock(%s) accepted a block with no assignable address", c)
		}
	}
}

func TestBlockIPv6CappedAndAddressesValid(t *testing.T) {
	b, err := NewBlock(netip.MustParsePrefix("fd00:1:2:3::/64"))
	if err != nil {
		t.Fatal(err)
	}
	if b.Size() != MaxBlockAddresses {
		t.Fatalf("size = %d, want %d", b.Size(), MaxBlockAddresses)
	}
	a, _ := b.Allocate()
	if a.String() != "fd00:1:2:3::1" {
		t.Fatalf("first = %v", a)
	}
	// Crossing a byte boundary must carry.
	for i := 0; i < 300; i++ {
		a, _ = b.Allocate()
	}
	if a.String() != "fd00:1:2:3::12d" || !b.InUse(a) {
		t.Fatalf("301st = %v", a)
	}
	if err := b.Reserve(netip.MustParseAddr("fd00:1:2:3:1::1")); err == nil {
		t.Fatal("address beyond the cap accepted")
	}
}

func TestPoolDualStackAllOrNothing(t *testing.T) {
	p, err := NewPool([]netip.Prefix{netip.MustParsePrefix("10.9.0.0/30"), netip.MustParsePrefix("fd00::/126")})
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Allocate()
	if err != nil || len(got) != 2 || !got[0].Addr().Is4() || !got[1].Addr().Is6() || got[0].Bits() != 32 || got[1].Bits() != 128 {
		t.Fatalf("Allocate = %v, %v", got, err)
	}
	// v4 /30 has 2 addresses, v6 /126 has 3: the second pod exhausts IPv4.
	if _, err := p.Allocate(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Allocate(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("third Allocate err = %v, want exhausted", err)
	}
	u := p.Usage()
	if u[1].Used != 2 {
		t.Fatalf("failed allocation leaked an IPv6 address: %+v", u)
	}
	if ok, why := p.CanServe(); !ok {
		t.Fatalf("full IPv4 block makes the node unservable: %s", why)
	}
	p.Release(got)
	p.Release(got) // idempotent
	if p.Usage()[0].Used != 1 {
		t.Fatalf("release did not free: %+v", p.Usage())
	}
}

func TestPoolRejectsOverlap(t *testing.T) {
	if _, err := NewPool([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("10.0.1.0/24")}); err == nil {
		t.Fatal("overlapping CIDRs accepted")
	}
}

func TestEmptyPool(t *testing.T) {
	p, _ := NewPool(nil)
	if _, err := p.Allocate(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("err = %v", err)
	}
	if ok, _ := p.CanServe(); ok {
		t.Fatal("empty pool claims it can serve")
	}
}

func FuzzBlockAllocateRelease(f *testing.F) {
	f.Add("10.1.0.0/28", []byte{1, 2, 3, 200})
	f.Add("fd00::/120", []byte{0, 0, 255})
	f.Fuzz(func(t *testing.T, cidr string, ops []byte) {
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			return
		}
		b, err := NewBlock(p)
		if err != nil {
			return
		}
		held := map[netip.Addr]bool{}
		for _, op := range ops {
			if op < 160 || len(held) == 0 {
				a, err := b.Allocate()
				if err != nil {
					if len(held) != b.Size() {
						t.Fatalf("exhausted with %d of %d held", len(held), b.Size())
					}
					continue
				}
				if held[a] || !b.Contains(a) {
					t.Fatalf("bad allocation %v", a)
				}
				held[a] = true
			} else {
				for a := range held {
					b.Release(a)
					delete(held, a)
					break
				}
			}
			if b.Used() != len(held) {
				t.Fatalf("used %d, held %d", b.Used(), len(held))
			}
		}
	})
}
