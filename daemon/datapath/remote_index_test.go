package datapath

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/coordino/coordino/daemon/identity"
)

// remotePodAddr is the i-th remote pod of a cluster with 110 pods per node
// block (10.<node/256>.<node%256>.x, and fd00::<node>:x for odd i).
func remotePodAddr(i int) netip.Addr {
	node, pod := i/110, i%110+1
	if i%2 == 1 {
		return netip.AddrFrom16([16]byte{0: 0xfd, 12: byte(node >> 8), 13: byte(node), 15: byte(pod)})
	}
	return netip.AddrFrom4([4]byte{10, byte(node >> 8), byte(node), byte(pod)})
}

// inside visits exactly the remote addresses a prefix holds, after
// upserts and removals, for both families and prefixes of any length.
func TestRemoteInsidePrefix(t *testing.T) {
	var r remoteAddrs
	var all []netip.Addr
	for i := 0; i < 5000; i++ {
		a := remotePodAddr(i)
		r.set(a, identity.FirstPod)
		all = append(all, a)
	}
	for i := 0; i < len(all); i += 7 {
		if !r.forget(all[i]) {
			t.Fatalf("forget(%v) reported it unknown", all[i])
		}
	}
	if r.forget(netip.MustParseAddr("192.0.2.1")) {
		t.Fatal("forget of an unknown address reported it known")
	}
	r.set(all[1], identity.FirstPod+1) // a changed identity keeps one index entry
	rng := rand.New(rand.NewPCG(1, 2))
	prefixes := []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0"),
		netip.MustParsePrefix("10.0.3.0/24"), netip.MustParsePrefix("10.0.3.64/26"),
		netip.MustParsePrefix("fd00::/64"), netip.MustParsePrefix("192.0.2.0/24"),
		netip.MustParsePrefix("10.0.3.17/32"),
	}
	for i := 0; i < 200; i++ {
		a := all[rng.IntN(len(all))]
		p, _ := a.Prefix(rng.IntN(a.BitLen() + 1))
		prefixes = append(prefixes, p)
	}
	for _, p := range prefixes {
		var got, want []netip.Addr
		r.inside(p, func(a netip.Addr) { got = append(got, a) })
		for a := range r.pods {
			if p.Contains(a) {
				want = append(want, a)
			}
		}
		slices.SortFunc(want, netip.Addr.Compare)
		if !slices.Equal(got, want) {
			t.Fatalf("inside(%v) visited %d addresses, want %d", p, len(got), len(want))
		}
	}
	if n := r.sorted.Len(); n != len(r.pods) {
		t.Fatalf("index holds %d addresses, the map %d", n, len(r.pods))
	}
}

// BenchmarkNewIPBlockPrefix: the remote addresses a new ipBlock prefix
// (one node's /24, 110 pods) re-marks, found through the index and, as
// the same-run reference, by the full scan the index replaced. The
// index's cost stays flat as the cluster grows; the scan's grows with it.
func BenchmarkNewIPBlockPrefix(b *testing.B) {
	for _, total := range []int{10_000, 100_000, 550_000} {
		var r remoteAddrs
		for i := 0; i < total; i++ {
			r.set(remotePodAddr(i), identity.FirstPod)
		}
		p := netip.MustParsePrefix("10.0.42.0/24")
		b.Run(fmt.Sprintf("index/remote=%d", total), func(b *testing.B) {
			n := 0
			for b.Loop() {
				n = 0
				r.inside(p, func(netip.Addr) { n++ })
			}
			b.ReportMetric(float64(n), "visited")
		})
		b.Run(fmt.Sprintf("scan/remote=%d", total), func(b *testing.B) {
			n := 0
			for b.Loop() {
				n = 0
				for a := range r.pods {
					if p.Contains(a) {
						n++
					}
				}
			}
			b.ReportMetric(float64(n), "visited")
		})
	}
}
