package datapath

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/test/privileged"
	"go.uber.org/zap/zaptest"
)

// openBare opens a datapath without pods, with a conntrack table of size.
func openBare(t testing.TB, size int) *Datapath {
	t.Helper()
	privileged.Require(t)
	d, err := Open(Config{BPFDir: testnet.BPFDir(t), AttachMode: AttachTC, Logger: zaptest.NewLogger(t), ConntrackSize: size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.UpdatePolicy(policy.Snapshot{}); err != nil {
		t.Fatal(err)
	}
	return d
}

var (
	purgedIf   = uint32(4242)
	purgedAddr = netip.MustParseAddr("10.99.0.7")
)

// fillConntrack writes n entries of other endpoints among other addresses
// and, for the purged endpoint, own entries on its interface plus as many
// naming its address as source and as destination on other interfaces.
// It returns the keys that must go and those that must stay.
func fillConntrack(t testing.TB, d *Datapath, n, own int) (gone, kept []bpf.CoordinoCtKey) {
	t.Helper()
	_, addr := packetAddr(purgedAddr)
	key := func(i int, ifindex uint32) bpf.CoordinoCtKey {
		k := bpf.CoordinoCtKey{Ifindex: ifindex, Proto: 6, Family: 4, Sport: uint16(i), Dport: uint16(i >> 16)}
		k.Src = [16]byte{10, 1, byte(i >> 8), byte(i)}
		k.Dst = [16]byte{10, 2, byte(i >> 16), byte(i >> 8)}
		return k
	}
	for i := range n {
		kept = append(kept, key(i, uint32(100+i%500)))
	}
	for i := range own {
		gone = append(gone, key(i, purgedIf))
		src := key(n+i, 7)
		src.Src = addr
		dst := key(n+own+i, 8)
		dst.Dst = addr
		gone = append(gone, src, dst)
	}
	v := bpf.CoordinoCtEntry{LastSeenNs: uint64(time.Now().UnixNano())}
	for _, ks := range [][]bpf.CoordinoCtKey{kept, gone} {
		for len(ks) > 0 {
			chunk := ks[:min(len(ks), ctBatch)]
			vals := make([]bpf.CoordinoCtEntry, len(chunk))
			for i := range vals {
				vals[i] = v
			}
			if _, err := d.objs.CdoConntrack.BatchUpdate(chunk, vals, nil); err != nil {
				t.Fatal(err)
			}
			ks = ks[len(chunk):]
		}
	}
	return gone, kept
}

// TestPurgeConntrackComplete: the purge of a removed endpoint deletes
// every entry on its interface or naming its address, and nothing else.
func TestPurgeConntrackComplete(t *testing.T) {
	d := openBare(t, 1<<16)
	gone, kept := fillConntrack(t, d, 30000, 3000)
	d.ct.purgeEndpoint(purgedIf, []netip.Addr{purgedAddr})
	var v bpf.CoordinoCtEntry
	left := 0
	for i := range gone {
		if err := d.objs.CdoConntrack.Lookup(&gone[i], &v); !errors.Is(err, ebpf.ErrKeyNotExist) {
			left++
		}
	}
	if left > 0 {
		t.Errorf("%d of %d entries of the removed endpoint left", left, len(gone))
	}
	if n, err := d.ct.entries(); err != nil || n != len(kept) {
		t.Errorf("%d entries remain (%v), want the %d of other endpoints", n, err, len(kept))
	}
}

// purgeByIterator is the purge before batching, the benchmark's reference.
func purgeByIterator(d *Datapath, ifindex uint32, ips []netip.Addr) {
	gone := map[[16]byte]bool{}
	for _, ip := range ips {
		_, b := packetAddr(ip)
		gone[b] = true
	}
	var dead []bpf.CoordinoCtKey
	_ = d.ct.iterate(func(k *bpf.CoordinoCtKey, _ *bpf.CoordinoCtEntry) {
		if k.Ifindex == ifindex || gone[k.Src] || gone[k.Dst] {
			dead = append(dead, *k)
		}
	})
	for i := range dead {
		_ = deleteKey(d.objs.CdoConntrack, &dead[i])
	}
}

// BenchmarkPurgeConntrack times the DEL-time purge of an endpoint with 300
// flows in a default-size table (262,144 entries) that is 80 % full, with
// batches and, as the reference, with the per-entry iterator.
func BenchmarkPurgeConntrack(b *testing.B) {
	d := openBare(b, DefaultConntrackSize)
	for _, bc := range []struct {
		name  string
		purge func(*Datapath, uint32, []netip.Addr)
	}{{"batch", func(d *Datapath, ifindex uint32, ips []netip.Addr) { d.ct.purgeEndpoint(ifindex, ips) }}, {"iterator-reference", purgeByIterator}} {
		b.Run(bc.name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				fillConntrack(b, d, DefaultConntrackSize*8/10, 100)
				b.StartTimer()
				bc.purge(d, purgedIf, []netip.Addr{purgedAddr})
			}
		})
	}
}

// BenchmarkDetachConntrack times DetachEndpoint of a pod whose address
// has 300 flows in a default-size table 80 % full: "walk-reference" adds
// the table walk DEL did before the purge moved to the background, in the
// same run; "queued" is DEL as it is and reports its ratio to the reference.
func BenchmarkDetachConntrack(b *testing.B) {
	privileged.Require(b)
	d, err := Open(Config{BPFDir: testnet.BPFDir(b), AttachMode: AttachTC, ConntrackSize: DefaultConntrackSize,
		purgeInterval: time.Hour}) // no background walk during the timing
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	if err := d.UpdatePolicy(policy.Snapshot{}); err != nil {
		b.Fatal(err)
	}
	p := testnet.NewPod(b, "del", purgedAddr)
	ep := Endpoint{Key: "net/bench-del/eth0", HostIfName: p.HostIfName, HostIfIndex: p.HostIfIndex, IPs: p.IPs}
	var reference float64
	for _, bc := range []struct {
		name string
		walk bool
	}{{"walk-reference", true}, {"queued", false}} {
		b.Run(bc.name, func(b *testing.B) {
			var timed time.Duration
			for range b.N {
				b.StopTimer()
				fillConntrack(b, d, DefaultConntrackSize*8/10, 100)
				// A pending purge of the interface makes this attach walk: untimed.
				if err := d.AttachEndpoint(ep); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := time.Now()
				if err := d.DetachEndpoint(ep); err != nil {
					b.Fatal(err)
				}
				if bc.walk {
					d.ct.purgeEndpoint(uint32(ep.HostIfIndex), ep.IPs)
				}
				timed += time.Since(start)
			}
			perOp := float64(timed.Nanoseconds()) / float64(b.N)
			if bc.walk {
				reference = perOp
			} else if reference > 0 {
				b.ReportMetric(perOp/reference, "x-walk-reference")
			}
		})
	}
}
