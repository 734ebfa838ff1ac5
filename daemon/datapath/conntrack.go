package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/bpf"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// DefaultConntrackSize is the conntrack table's default capacity: about
// 30 MiB of kernel memory, room for ~1,000 flows of each of 256 isolated
// pods. Only endpoints with an isolated direction use entries, and an
// evicted entry is re-created by the flow's next allowed packet.
const DefaultConntrackSize = 1 << 18

// MinConntrackSize is the smallest accepted capacity.
const MinConntrackSize = 64

// retiredPins are pins of maps earlier versions used: removed at Open so
// nothing is left behind after an upgrade. A program still attached keeps
// its map until it is replaced. cdo_ct_memo is cdo_flow_memo's old layout,
// whose entries an older program would misread.
var retiredPins = []string{"cdo_counters", "cdo_ct_memo"}

// prepareConntrack sizes the conntrack map and drops a pinned one that no
// longer fits (another size or layout). Conntrack is a cache of verdicts
// policy can re-create, so replacing it breaks no connection.
func prepareConntrack(cfg *Config, spec *ebpf.CollectionSpec, log *zap.Logger) error {
	if cfg.ConntrackSize == 0 {
		cfg.ConntrackSize = DefaultConntrackSize
	}
	if cfg.ConntrackSize < MinConntrackSize || cfg.ConntrackSize > 1<<26 {
		return fmt.Errorf("datapath: conntrack-size %d: want %d to %d", cfg.ConntrackSize, MinConntrackSize, 1<<26)
	}
	ms := spec.Maps[bpf.CoordinoMapCdoConntrack]
	ms.MaxEntries = uint32(cfg.ConntrackSize)
	for _, name := range retiredPins {
		if err := os.Remove(filepath.Join(cfg.BPFDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("datapath: remove retired pin %s: %w", name, err)
		}
	}
	pin := filepath.Join(cfg.BPFDir, bpf.CoordinoMapCdoConntrack)
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("datapath: open pinned conntrack: %w", err)
	}
	info, err := m.Info()
	m.Close()
	if err != nil {
		return fmt.Errorf("datapath: inspect pinned conntrack: %w", err)
	}
	if info.Type == ms.Type && info.KeySize == ms.KeySize && info.ValueSize == ms.ValueSize && info.MaxEntries == ms.MaxEntries {
		return nil
	}
	log.Info("replacing pinned conntrack table: tracked flows are re-created by their next allowed packet",
		zap.Uint32("oldSize", info.MaxEntries), zap.Uint32("newSize", ms.MaxEntries))
	if err := os.Remove(pin); err != nil {
		return fmt.Errorf("datapath: remove pinned conntrack: %w", err)
	}
	return nil
}

var (
	ctCapacityDesc = prometheus.NewDesc("coordino_conntrack_capacity",
		"Capacity of the conntrack table (--conntrack-size).", nil, nil)
	ctEntriesDesc = prometheus.NewDesc("coordino_conntrack_entries",
		"Entries in the conntrack table at scrape time; near the capacity the kernel evicts the least recently used.", nil, nil)
	ctEventsDesc = prometheus.NewDesc("coordino_conntrack_events_total",
		"Conntrack activity: created entries, pickups (re-created from a mid-flow TCP packet after eviction or expiry), expired entries, flows revoked by policy.",
		[]string{"event"}, nil)
)

var ctStatNames = map[bpf.CoordinoCtStat]string{
	bpf.CoordinoCtStatCT_STAT_CREATED: "created",
	bpf.CoordinoCtStatCT_STAT_PICKUP:  "pickup",
	bpf.CoordinoCtStatCT_STAT_EXPIRED: "expired",
	bpf.CoordinoCtStatCT_STAT_REVOKED: "revoked",
}

func describeConntrack(ch chan<- *prometheus.Desc) {
	ch <- ctCapacityDesc
	ch <- ctEntriesDesc
	ch <- ctEventsDesc
}

func (d *Datapath) collectConntrack(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(ctCapacityDesc, prometheus.GaugeValue, float64(d.objs.CdoConntrack.MaxEntries()))
	if n, err := d.conntrackEntries(); err == nil {
		ch <- prometheus.MustNewConstMetric(ctEntriesDesc, prometheus.GaugeValue, float64(n))
	}
	for slot, name := range ctStatNames {
		v, err := d.ctStat(slot)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(ctEventsDesc, prometheus.CounterValue, float64(v), name)
	}
}

// ctStat sums one conntrack statistic over all CPUs.
func (d *Datapath) ctStat(slot bpf.CoordinoCtStat) (uint64, error) {
	var perCPU []uint64
	if err := d.objs.CdoCtStats.Lookup(uint32(slot), &perCPU); err != nil {
		return 0, err
	}
	var sum uint64
	for _, v := range perCPU {
		sum += v
	}
	return sum, nil
}

// conntrackEntries counts the table's entries: from the kernel's count
// where it has one, else by reading the table.
func (d *Datapath) conntrackEntries() (int, error) {
	if d.ctCounter != nil {
		if n, err := d.ctCounter.count(); err == nil {
			return n, nil
		}
	}
	return d.conntrackEntriesRead()
}

// conntrackEntriesRead counts the table's entries by reading all of them.
func (d *Datapath) conntrackEntriesRead() (int, error) {
	n := 0
	err := d.walkConntrack(func(*bpf.CoordinoCtKey, *bpf.CoordinoCtEntry) { n++ })
	return n, err
}

// ctBatch is the number of entries a batch operation moves per syscall.
const ctBatch = 4096

// ctBatchBuf is one batch's worth of keys and values.
type ctBatchBuf struct {
	keys [ctBatch]bpf.CoordinoCtKey
	vals [ctBatch]bpf.CoordinoCtEntry
}

// ctBatchBufs recycles the batch buffers (~240 KiB): DEL used to walk the
// table, and a fresh buffer each time was most of what it allocated.
var ctBatchBufs = sync.Pool{New: func() any { return new(ctBatchBuf) }}

// walkConntrack calls fn for every key of the conntrack table, read in
// batches of ctBatch (two syscalls per entry with an iterator), falling
// back to the iterator on kernels without batch operations. fn's pointers
// are valid only during the call.
func (d *Datapath) walkConntrack(fn func(*bpf.CoordinoCtKey, *bpf.CoordinoCtEntry)) error {
	d.ctWalks.Add(1)
	buf := ctBatchBufs.Get().(*ctBatchBuf)
	defer ctBatchBufs.Put(buf)
	var cursor ebpf.MapBatchCursor
	keys, vals := buf.keys[:], buf.vals[:]
	for first := true; ; first = false {
		n, err := d.objs.CdoConntrack.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			fn(&keys[i], &vals[i])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return nil
		case first && errors.Is(err, ebpf.ErrNotSupported):
			return d.iterateConntrack(fn)
		case err != nil:
			return err
		}
	}
}

func (d *Datapath) iterateConntrack(fn func(*bpf.CoordinoCtKey, *bpf.CoordinoCtEntry)) error {
	var (
		k bpf.CoordinoCtKey
		v bpf.CoordinoCtEntry
	)
	it := d.objs.CdoConntrack.Iterate()
	for it.Next(&k, &v) {
		fn(&k, &v)
	}
	return it.Err()
}

// deleteConntrack deletes keys in batches; entries gone meanwhile (expired,
// evicted) are not errors.
func (d *Datapath) deleteConntrack(keys []bpf.CoordinoCtKey) {
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), ctBatch)]
		n, err := d.objs.CdoConntrack.BatchDelete(chunk, nil)
		switch {
		case err == nil:
			keys = keys[len(chunk):]
		case errors.Is(err, ebpf.ErrKeyNotExist) && n < len(chunk):
			keys = keys[n+1:] // the batch stopped at a key gone meanwhile
		default:
			for i := n; i < len(chunk); i++ {
				_ = deleteKey(d.objs.CdoConntrack, &chunk[i])
			}
			keys = keys[len(chunk):]
		}
	}
}
