package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

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

// conntrack is the conntrack table's part: it counts, reads and purges the
// table (the programs write it). Its methods are safe for concurrent use;
// purges of removed endpoints run in its background walker (ctpurge.go).
type conntrack struct {
	table, stats *ebpf.Map
	log          *zap.Logger
	// walks counts full reads of the table.
	walks atomic.Uint64
	// counter counts the table's entries without reading it; nil where the
	// kernel cannot (mapcount.go).
	counter *mapCounter
	// purger holds the removed endpoints whose entries are still to purge.
	purger *ctPurger
}

// openConntrack opens the pinned purge set in dir and starts the
// background walker; close stops it.
func openConntrack(table, stats *ebpf.Map, dir string, interval time.Duration, log *zap.Logger) (*conntrack, error) {
	pm, err := openPurgeMap(dir)
	if err != nil {
		return nil, err
	}
	p, err := newPurger(pm, interval)
	if err != nil {
		pm.Close()
		return nil, err
	}
	c := &conntrack{table: table, stats: stats, log: log, counter: openMapCounter(table, log), purger: p}
	go c.runPurger()
	return c, nil
}

// close stops the walker after the walk under way (it reads the table,
// closed by the caller afterwards) and releases the part's descriptors.
func (c *conntrack) close() error {
	c.purger.stopPurger()
	errs := []error{c.purger.m.Close()}
	if c.counter != nil {
		errs = append(errs, c.counter.Close())
	}
	return errors.Join(errs...)
}

// queue records a removed endpoint's interface and addresses as pending
// a purge (ctPurger.queue).
func (c *conntrack) queue(ifindex uint32, ips []netip.Addr) error {
	return c.purger.queue(ifindex, ips)
}

// wake starts a background walk of what is pending.
func (c *conntrack) wake() { c.purger.wake() }

// pendingPurges is how many interfaces and addresses are pending.
func (c *conntrack) pendingPurges() int { return c.purger.pendingPurges() }

// collectors are the purge's metrics.
func (c *conntrack) collectors() []prometheus.Collector {
	return []prometheus.Collector{c.purger.walks, c.purger.pendingEp}
}

func (c *conntrack) collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(ctCapacityDesc, prometheus.GaugeValue, float64(c.table.MaxEntries()))
	if n, err := c.entries(); err == nil {
		ch <- prometheus.MustNewConstMetric(ctEntriesDesc, prometheus.GaugeValue, float64(n))
	}
	for slot, name := range ctStatNames {
		v, err := c.stat(slot)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(ctEventsDesc, prometheus.CounterValue, float64(v), name)
	}
}

// ctStat sums one conntrack statistic over all CPUs.
func (c *conntrack) stat(slot bpf.CoordinoCtStat) (uint64, error) {
	var perCPU []uint64
	if err := c.stats.Lookup(uint32(slot), &perCPU); err != nil {
		return 0, err
	}
	var sum uint64
	for _, v := range perCPU {
		sum += v
	}
	return sum, nil
}

// entries counts the table's entries: from the kernel's count
// where it has one, else by reading the table.
func (c *conntrack) entries() (int, error) {
	if c.counter != nil {
		if n, err := c.counter.count(); err == nil {
			return n, nil
		}
	}
	return c.entriesRead()
}

// entriesRead counts the table's entries by reading all of them.
func (c *conntrack) entriesRead() (int, error) {
	n := 0
	err := c.walk(func(*bpf.CoordinoCtKey, *bpf.CoordinoCtEntry) { n++ })
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

// walk calls fn for every key of the conntrack table, read in
// batches of ctBatch (two syscalls per entry with an iterator), falling
// back to the iterator on kernels without batch operations. fn's pointers
// are valid only during the call.
func (c *conntrack) walk(fn func(*bpf.CoordinoCtKey, *bpf.CoordinoCtEntry)) error {
	c.walks.Add(1)
	buf := ctBatchBufs.Get().(*ctBatchBuf)
	defer ctBatchBufs.Put(buf)
	var cursor ebpf.MapBatchCursor
	keys, vals := buf.keys[:], buf.vals[:]
	for first := true; ; first = false {
		n, err := c.table.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			fn(&keys[i], &vals[i])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return nil
		case first && errors.Is(err, ebpf.ErrNotSupported):
			return c.iterate(fn)
		case err != nil:
			return err
		}
	}
}

func (c *conntrack) iterate(fn func(*bpf.CoordinoCtKey, *bpf.CoordinoCtEntry)) error {
	var (
		k bpf.CoordinoCtKey
		v bpf.CoordinoCtEntry
	)
	it := c.table.Iterate()
	for it.Next(&k, &v) {
		fn(&k, &v)
	}
	return it.Err()
}

// delete deletes keys in batches; entries gone meanwhile (expired,
// evicted) are not errors.
func (c *conntrack) delete(keys []bpf.CoordinoCtKey) {
	for len(keys) > 0 {
		chunk := keys[:min(len(keys), ctBatch)]
		n, err := c.table.BatchDelete(chunk, nil)
		switch {
		case err == nil:
			keys = keys[len(chunk):]
		case errors.Is(err, ebpf.ErrKeyNotExist) && n < len(chunk):
			keys = keys[n+1:] // the batch stopped at a key gone meanwhile
		default:
			for i := n; i < len(chunk); i++ {
				_ = deleteKey(c.table, &chunk[i])
			}
			keys = keys[len(chunk):]
		}
	}
}

// purgeEndpoint drops the tracked flows of one removed endpoint now: those
// seen on its interface, so a future interface reusing the index starts
// clean, and those other endpoints track with one of its addresses, so a pod
// that is given the address next never inherits a flow of the deleted one.
// DEL queues this for the background walk (ctpurge.go) and calls it only
// when it cannot. The table is read and the dead entries deleted in batches
// (conntrack.go).
func (c *conntrack) purgeEndpoint(ifindex uint32, ips []netip.Addr) {
	gone := map[[16]byte]bool{}
	for _, ip := range ips {
		_, b := packetAddr(ip)
		gone[b] = true
	}
	err := c.purgeWhere(func(k *bpf.CoordinoCtKey, _ *bpf.CoordinoCtEntry) bool {
		return k.Ifindex == ifindex || gone[k.Src] || gone[k.Dst]
	})
	if err != nil {
		c.log.Warn("conntrack purge incomplete: entries of the removed endpoint expire on their own", zap.Error(err))
	}
}

// purgeWhere deletes the conntrack entries drop selects; entries it
// could not read are left to expire, and the read error is returned.
func (c *conntrack) purgeWhere(drop func(*bpf.CoordinoCtKey, *bpf.CoordinoCtEntry) bool) error {
	var dead []bpf.CoordinoCtKey
	err := c.walk(func(k *bpf.CoordinoCtKey, v *bpf.CoordinoCtEntry) {
		if drop(k, v) {
			dead = append(dead, *k)
		}
	})
	c.delete(dead)
	return err
}
