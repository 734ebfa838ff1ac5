package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/bpf"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Conntrack purge of removed endpoints, off the DEL path.
//
// A removed endpoint's tracked flows must be gone before anything can
// inherit them: the entries on its interface (a new interface may get the
// index) and the entries of other endpoints naming one of its addresses (a
// new pod may get the address). The table has no index by interface or
// address, so finding them reads all of it: about 165 ms for a default
// table 80 % full, on every DEL. So DEL does not read the table. It records
// the interface and addresses as pending (in memory and in the pinned map
// cdo_ct_purge, one write each) and one background walk serves every
// pending removal: at most one walk at a time, at most one per
// purgeInterval unless purgeBatch endpoints are waiting.
//
// The guarantee is kept where it matters, at the next user: AttachEndpoint
// checks its interface index and addresses against the pending set before
// it writes anything, and if one is pending it walks the table itself
// before the programs go on (rare: IPAM hands out a freed address last and
// the kernel allocates interface indexes cyclically). Meanwhile a stale
// entry is harmless to everyone else: the removed pod's interface is gone,
// and an entry of another pod naming its address is re-decided against
// current policy on its next packet, as DEL changed the policy revision.
//
// A crash loses nothing: the pinned map still lists what was pending, and
// Open purges it, together with entries on interfaces no endpoint has,
// before the daemon serves.
//
// The alternative, a generation per interface and address checked by the
// programs (stale entries ignored, swept lazily), costs two more lookups
// per packet and a new entry layout; the background walk costs DEL nothing
// and the packet path nothing, and its one walk per second at most is
// shared by all removals.

const (
	ctPurgeMapName       = "cdo_ct_purge"
	maxPendingPurges     = 65536
	defaultPurgeInterval = time.Second
	// purgeBatch endpoints pending start a walk before the interval is up.
	purgeBatch = 64
)

// purgeKey names one pending thing: an interface (Addr zero) or an address
// as the programs store it (Ifindex zero).
type purgeKey struct {
	Ifindex uint32
	Addr    [16]byte
}

// ctPurger is the pending set and its walker.
type ctPurger struct {
	m *ebpf.Map // pinned copy of pending's keys

	mu sync.Mutex
	// pending maps each key to the sequence number of the removal that
	// queued it last, so a walk clears only what it served.
	pending   map[purgeKey]uint64
	seq       uint64
	lastWalk  time.Time
	interval  time.Duration
	walkMu    sync.Mutex // one walk at a time
	kick      chan struct{}
	stop      chan struct{}
	stopped   chan struct{}
	walks     *prometheus.CounterVec
	pendingEp prometheus.GaugeFunc
}

func openPurgeMap(dir string) (*ebpf.Map, error) {
	m, err := openUserspaceMap(dir, ctPurgeMapName, uint32(binary.Size(purgeKey{})), 1, maxPendingPurges)
	if err != nil {
		return nil, fmt.Errorf("datapath: open conntrack purge map: %w", err)
	}
	return m, nil
}

// newPurger loads what a previous daemon left pending.
func newPurger(m *ebpf.Map, interval time.Duration) (*ctPurger, error) {
	if interval <= 0 {
		interval = defaultPurgeInterval
	}
	p := &ctPurger{m: m, pending: map[purgeKey]uint64{}, interval: interval,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{}),
		walks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordino_conntrack_purge_walks_total",
			Help: "Walks of the conntrack table that purged removed endpoints' flows, by trigger (background: coalesced after DELs; attach: an ADD reusing a pending interface or address; start: daemon start).",
		}, []string{"trigger"})}
	for _, t := range []string{purgeBackground, purgeAttach, purgeStart} {
		p.walks.WithLabelValues(t)
	}
	p.pendingEp = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "coordino_conntrack_purge_pending",
		Help: "Removed endpoints whose conntrack entries are not purged yet (0 once the background walk caught up).",
	}, func() float64 { return float64(p.pendingEndpoints()) })
	var k purgeKey
	var v uint8
	it := m.Iterate()
	for it.Next(&k, &v) {
		p.pending[k] = 0
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("datapath: read pending conntrack purges: %w", err)
	}
	return p, nil
}

// Walk triggers, the label of coordino_conntrack_purge_walks_total.
const (
	purgeBackground = "background"
	purgeAttach     = "attach"
	purgeStart      = "start"
)

func purgeKeys(ifindex uint32, ips []netip.Addr) []purgeKey {
	ks := []purgeKey{{Ifindex: ifindex}}
	for _, ip := range ips {
		_, b := packetAddr(ip)
		ks = append(ks, purgeKey{Addr: b})
	}
	return ks
}

func (p *ctPurger) pendingEndpoints() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for k := range p.pending {
		if k.Ifindex != 0 {
			n++
		}
	}
	return n
}

// queue records a removed endpoint's interface and addresses as pending,
// persisted before it returns, and wakes the walker.
func (p *ctPurger) queue(ifindex uint32, ips []netip.Addr) error {
	p.mu.Lock()
	p.seq++
	var err error
	for _, k := range purgeKeys(ifindex, ips) {
		if e := p.m.Update(&k, uint8(0), ebpf.UpdateAny); e != nil {
			err = fmt.Errorf("record pending conntrack purge: %w", e)
			break
		}
		p.pending[k] = p.seq
	}
	p.mu.Unlock()
	p.wake()
	return err
}

func (p *ctPurger) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// isPending reports whether the interface or one of the addresses still
// has a removed endpoint's entries to purge.
func (p *ctPurger) isPending(ifindex uint32, ips []netip.Addr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, k := range purgeKeys(ifindex, ips) {
		if _, ok := p.pending[k]; ok {
			return true
		}
	}
	return false
}

// purgePending walks the table once and deletes the entries of everything
// pending when the walk began, and those extra selects (nil: none). What
// was queued meanwhile stays pending; on a read error everything does.
func (c *conntrack) purgePending(trigger string, extra func(*bpf.CoordinoCtKey) bool) error {
	p := c.purger
	p.walkMu.Lock()
	defer p.walkMu.Unlock()
	p.mu.Lock()
	served := make(map[purgeKey]uint64, len(p.pending))
	ifs, addrs := map[uint32]bool{}, map[[16]byte]bool{}
	for k, s := range p.pending {
		served[k] = s
		if k.Ifindex != 0 {
			ifs[k.Ifindex] = true
		} else {
			addrs[k.Addr] = true
		}
	}
	if len(served) == 0 && extra == nil {
		p.mu.Unlock()
		return nil
	}
	p.lastWalk = time.Now()
	p.mu.Unlock()
	p.walks.WithLabelValues(trigger).Inc()
	err := c.purgeWhere(func(k *bpf.CoordinoCtKey, _ *bpf.CoordinoCtEntry) bool {
		return ifs[k.Ifindex] || addrs[k.Src] || addrs[k.Dst] || (extra != nil && extra(k))
	})
	if err != nil {
		return fmt.Errorf("conntrack purge incomplete (retried): %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for k, s := range served {
		if p.pending[k] != s {
			continue // queued again during the walk
		}
		if err := deleteKey(p.m, &k); err != nil {
			errs = append(errs, err) // stays pending, so the pin is not orphaned
			continue
		}
		delete(p.pending, k)
	}
	if len(errs) > 0 {
		return fmt.Errorf("clear pending conntrack purges: %w", errors.Join(errs...))
	}
	return nil
}

// settle makes sure no entry of a removed endpoint is left on ifindex
// or naming one of ips before a new endpoint uses them: it walks the table
// now if one is still pending (waiting first for a walk under way).
func (c *conntrack) settle(ifindex uint32, ips []netip.Addr) error {
	if !c.purger.isPending(ifindex, ips) {
		return nil
	}
	// Waits for a walk under way, which may have served it.
	c.purger.walkMu.Lock()
	c.purger.walkMu.Unlock() //nolint:staticcheck // SA2001: the empty section is the wait
	if !c.purger.isPending(ifindex, ips) {
		return nil
	}
	if err := c.purgePending(purgeAttach, nil); err != nil {
		return fmt.Errorf("flows of a removed endpoint with this interface or address not purged: %w", err)
	}
	return nil
}

// purgeAtStart purges what a previous daemon left pending and every entry
// on an interface no endpoint has: the pending set is persisted, and this
// also catches entries of an endpoint removed by a version that did not.
// Node flows (ifindex 0) are not an endpoint's; live are the endpoints'
// interfaces.
func (c *conntrack) purgeAtStart(live map[uint32]bool) error {
	return c.purgePending(purgeStart, func(k *bpf.CoordinoCtKey) bool {
		return k.Ifindex != 0 && !live[k.Ifindex]
	})
}

// runPurger is the background walker: it wakes on a queued removal, waits
// out the interval since the last walk unless purgeBatch endpoints are
// pending, and walks once for all of them. Close stops it after the walk
// under way; what is left stays pinned for the next Open.
func (c *conntrack) runPurger() {
	p := c.purger
	defer close(p.stopped)
	retry := (*time.Timer)(nil)
	for {
		select {
		case <-p.kick:
		case <-p.stop:
			return
		}
		for {
			p.mu.Lock()
			wait := time.Until(p.lastWalk.Add(p.interval))
			p.mu.Unlock()
			if wait <= 0 || p.pendingEndpoints() >= purgeBatch {
				break
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-p.kick: // recheck the batch size
				t.Stop()
			case <-p.stop:
				t.Stop()
				return
			}
		}
		if err := c.purgePending(purgeBackground, nil); err != nil {
			c.log.Warn("background conntrack purge failed; retrying", zap.Error(err))
			if retry != nil {
				retry.Stop()
			}
			retry = time.AfterFunc(p.interval, p.wake)
			continue
		}
		p.mu.Lock()
		left := len(p.pending) > 0
		p.mu.Unlock()
		if left {
			p.wake() // queued during the walk
		}
	}
}

// stopPurger ends the background walker; pending purges stay pinned.
func (p *ctPurger) stopPurger() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.stopped
}

// pendingPurges is how many interfaces and addresses are pending.
func (p *ctPurger) pendingPurges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pending)
}
