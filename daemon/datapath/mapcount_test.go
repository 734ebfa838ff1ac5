package datapath

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/coordino/coordino/bpf"
)

// TestConntrackCountWithoutReading: the conntrack size the metrics report
// is the kernel's count, read without walking the table, and it stays
// equal to what a walk finds through inserts, purges and LRU eviction.
func TestConntrackCountWithoutReading(t *testing.T) {
	const capacity = 1 << 12
	d := openBare(t, capacity)
	if d.ct.counter == nil {
		t.Fatal("no map entry counter: this kernel lacks the bpf_map iterator or bpf_map_sum_elem_count (6.6+)")
	}
	check := func(stage string) int {
		t.Helper()
		walks := d.ct.walks.Load()
		n, err := d.ct.entries()
		if err != nil {
			t.Fatalf("%s: count: %v", stage, err)
		}
		if w := d.ct.walks.Load() - walks; w != 0 {
			t.Errorf("%s: counting read the table %d times", stage, w)
		}
		walked, err := d.ct.entriesRead()
		if err != nil {
			t.Fatal(err)
		}
		if n != walked {
			t.Errorf("%s: counted %d entries, the table holds %d", stage, n, walked)
		}
		return n
	}
	if n := check("empty"); n != 0 {
		t.Errorf("empty table counted %d", n)
	}
	gone, kept := fillConntrack(t, d, 2000, 100)
	if n := check("filled"); n != len(gone)+len(kept) {
		t.Errorf("filled: %d entries, want %d", n, len(gone)+len(kept))
	}
	d.ct.purgeEndpoint(purgedIf, nil)
	check("purged")
	// Past capacity the kernel evicts the least recently used entries.
	k := bpf.CoordinoCtKey{Ifindex: 7, Proto: 17, Family: 4}
	for i := 0; i < 2*capacity; i++ {
		k.Sport, k.Src[3], k.Src[2] = uint16(i), byte(i), byte(i>>8)
		if err := d.objs.CdoConntrack.Update(&k, &bpf.CoordinoCtEntry{}, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	if n := check("overfilled"); n > capacity {
		t.Errorf("overfilled: %d entries in a table of %d", n, capacity)
	}
}

// BenchmarkConntrackCount is one scrape's count of a full conntrack table
// of the default size: the kernel's count against reading the table.
func BenchmarkConntrackCount(b *testing.B) {
	d := openBare(b, 1<<18)
	if d.ct.counter == nil {
		b.Fatal("no map entry counter on this kernel")
	}
	fillConntrack(b, d, 1<<18-1000, 500)
	for _, bc := range []struct {
		name  string
		count func() (int, error)
	}{
		{"kernel-count", d.ct.counter.count},
		{"walk", d.ct.entriesRead},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := bc.count(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
