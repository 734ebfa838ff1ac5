package controller

import (
	"net/netip"
	"testing"
)

func TestNthBlock(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		bits   int
		i      uint64
		want   string
	}{
		{"10.0.0.0/16", 26, 0, "10.0.0.0/26"},
		{"10.0.0.0/16", 26, 5, "10.0.1.64/26"},
		{"10.0.0.0/16", 26, 1023, "10.0.255.192/26"},
		{"fd00::/64", 122, 1, "fd00::40/122"},
		{"fd00::/48", 64, 3, "fd00:0:0:3::/64"},
		{"fd00::/48", 66, 5, "fd00:0:0:1:4000::/66"},
	} {
		got := nthBlock(netip.MustParsePrefix(tc.prefix), tc.bits, tc.i)
		if got.String() != tc.want {
			t.Errorf("nthBlock(%s, /%d, %d) = %s, want %s", tc.prefix, tc.bits, tc.i, got, tc.want)
		}
	}
}

// TestReserveNeverHandsOutAHeldBlock checks the index against claims made
// elsewhere (informer) and its own reservations, across a wrap of the
// cursor.
func TestReserveNeverHandsOutAHeldBlock(t *testing.T) {
	x := newBlockIndex()
	pool := netip.MustParsePrefix("10.0.0.0/24")
	x.setRanges("p", []netip.Prefix{pool}, func(netip.Prefix) int { return 26 })
	x.set(netip.MustParsePrefix("10.0.0.64/26"), blockHolder{node: "other", pool: "p", phase: "Active", uid: "u1"})
	seen := map[netip.Prefix]bool{}
	for i := 0; i < 3; i++ {
		b, ok := x.reserve("p", 0, "n")
		if !ok {
			t.Fatalf("reservation %d failed with free blocks left", i)
		}
		if seen[b] || b.String() == "10.0.0.64/26" {
			t.Fatalf("block %s handed out twice", b)
		}
		seen[b] = true
	}
	if b, ok := x.reserve("p", 0, "n"); ok {
		t.Fatalf("reserved %s from a full pool", b)
	}
	// A stale delete (other uid) must not free the block.
	x.remove(netip.MustParsePrefix("10.0.0.64/26"), "old-uid")
	if _, ok := x.reserve("p", 0, "n"); ok {
		t.Fatal("a stale delete event freed a held block")
	}
	x.remove(netip.MustParsePrefix("10.0.0.64/26"), "u1")
	if b, ok := x.reserve("p", 0, "n"); !ok || b.String() != "10.0.0.64/26" {
		t.Fatalf("freed block not reused after the cursor wrapped: %v %v", b, ok)
	}
	if got := x.allocatedIn("p"); got[0] != 4 {
		t.Fatalf("allocated count %v, want 4", got)
	}
	if got := x.totalIn("p"); got[0] != 4 {
		t.Fatalf("total %v, want 4", got)
	}
}

// TestFailedCreateKeepsTheInformersClaim: a claim create that failed for
// the client may still have been stored, and its informer event can arrive
// before the error. Cleaning up the reservation must not forget that claim
// (the block would be offered again and the claim never put in the
// node's spec); a reservation with no claim behind it is freed.
func TestFailedCreateKeepsTheInformersClaim(t *testing.T) {
	x := newBlockIndex()
	x.setRanges("pool", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, func(netip.Prefix) int { return 26 })
	p, ok := x.reserve("pool", 0, "n-03")
	if !ok {
		t.Fatal("no block")
	}
	x.set(p, blockHolder{node: "n-03", pool: "pool", phase: "Active", uid: "from-informer"})
	x.unreserve(p, "n-03")
	if h, ok := x.get(p); !ok || h.uid != "from-informer" {
		t.Fatalf("claim of %s forgotten after a failed create: %+v %v", p, h, ok)
	}
	q, _ := x.reserve("pool", 0, "n-04")
	x.unreserve(q, "n-04")
	if _, ok := x.get(q); ok {
		t.Fatalf("reservation of %s kept after its create failed", q)
	}
}
