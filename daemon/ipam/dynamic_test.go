package ipam

import (
	"errors"
	"net/netip"
	"testing"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestSetBlocksAddReleaseRemove(t *testing.T) {
	p, _ := NewPool(nil)
	if err := p.SetBlocks([]BlockSpec{{Prefix: pfx("10.1.0.0/30")}}); err != nil {
		t.Fatal(err)
	}
	a, err := p.Allocate()
	if err != nil {
		t.Fatal(err)
	}
	// The first block is being released and a second one arrives: new
	// addresses come only from the second.
	if err := p.SetBlocks([]BlockSpec{{Prefix: pfx("10.1.0.0/30"), Releasing: true}, {Prefix: pfx("10.1.0.8/30")}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		b, err := p.Allocate()
		if err != nil || !pfx("10.1.0.8/30").Contains(b[0].Addr()) {
			t.Fatalf("Allocate = %v, %v; want an address of the serving block", b, err)
		}
	}
	if _, err := p.Allocate(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("releasing block still serves: %v", err)
	}
	u := p.Usage()
	if len(u) != 2 || u[0].State != Releasing || u[0].Used != 1 || u[1].State != Serving || u[1].Used != 2 {
		t.Fatalf("usage = %+v", u)
	}
	// Removed while still in use: stays (bookkeeping) until released.
	if err := p.SetBlocks([]BlockSpec{{Prefix: pfx("10.1.0.8/30")}}); err != nil {
		t.Fatal(err)
	}
	if u := p.Usage(); len(u) != 2 || u[0].State != Removed || !p.InUse(a[0].Addr()) {
		t.Fatalf("removed in-use block dropped early: %+v", u)
	}
	p.Release(a)
	if u := p.Usage(); len(u) != 1 || u[0].Prefix != pfx("10.1.0.8/30") {
		t.Fatalf("drained removed block kept: %+v", u)
	}
}

func TestSetBlocksAbsorbsAddressesRestoredBeforeTheirBlock(t *testing.T) {
	p, _ := NewPool(nil)
	held := []netip.Prefix{pfx("10.2.0.1/32")}
	if _, err := p.Reserve(held); err != nil {
		t.Fatal(err)
	}
	if !p.InUse(held[0].Addr()) || len(p.Outside()) != 1 {
		t.Fatal("address outside every block forgotten")
	}
	if err := p.SetBlocks([]BlockSpec{{Prefix: pfx("10.2.0.0/30")}}); err != nil {
		t.Fatal(err)
	}
	got, err := p.Allocate()
	if err != nil || got[0] == held[0] {
		t.Fatalf("Allocate = %v, %v: handed out an address in use", got, err)
	}
	if len(p.Outside()) != 0 || p.Usage()[0].Used != 2 {
		t.Fatalf("outside=%v usage=%+v", p.Outside(), p.Usage())
	}
}

func TestSetBlocksReportsBadSpecsAndAppliesTheRest(t *testing.T) {
	p, _ := NewPool(nil)
	err := p.SetBlocks([]BlockSpec{{Prefix: pfx("10.3.0.0/24")}, {Prefix: pfx("10.3.0.0/25")}, {}, {Prefix: pfx("10.4.0.1/32")}, {Prefix: pfx("fd00::/120")}})
	if err == nil {
		t.Fatal("overlap, invalid and too-small blocks accepted silently")
	}
	if v4, v6 := p.Families(); !v4 || !v6 || len(p.Usage()) != 2 {
		t.Fatalf("valid blocks not applied: %+v", p.Usage())
	}
}

func TestReserveReportsUnassignableButKeepsTheRest(t *testing.T) {
	p, _ := NewPool([]netip.Prefix{pfx("10.5.0.0/24"), pfx("fd00:5::/120")})
	// The network address of the (new) block and a valid IPv6 address.
	rejected, err := p.Reserve([]netip.Prefix{pfx("10.5.0.0/32"), pfx("fd00:5::7/128")})
	if err == nil || len(rejected) != 1 || rejected[0] != pfx("10.5.0.0/32") {
		t.Fatalf("Reserve = %v, %v; want the network address rejected", rejected, err)
	}
	if !p.InUse(netip.MustParseAddr("fd00:5::7")) {
		t.Fatal("valid address of the same endpoint not reserved")
	}
}
