package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/bpf"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Map capacity. What each map does when it is full (docs/operations.md,
// "Map capacity"):
//
//	endpoints, source addresses  the ADD fails (CNI code 11) and is rolled back
//	ipcache  a prefix that does not fit holds back every shorter prefix that
//	         contains it, so its addresses resolve to the world identity,
//	         which no rule names: denied, never another prefix's allow
//	policy   the update fails closed (sync.go) and is retried
//	node isolation  allows that do not fit are left out, new isolation is
//	         not switched on ahead of them (nodeiso.go); retried
//	conntrack, frags  LRU: the least recently used entry is evicted; a flow
//	         is re-created by its next allowed packet, a later fragment
//	         whose first was evicted is dropped
//
// A refused write is counted (coordino_bpf_map_update_failures_total),
// logged once per episode and shown by coordinoctl status until the map
// takes entries again. Host routing's maps (hostPathMaps) are counted and
// logged too, but fail nothing: what does not fit takes the host's path.

// MapSizes are the capacities of the maps the daemon sizes from its flags;
// zero fields take the default. Changing one at restart copies the pinned
// map into one of the new size (the programs switch to it when re-attached).
type MapSizes struct {
	Endpoints   int // --endpoints-map-size
	Ipcache     int // --ipcache-map-size
	Policy      int // --policy-map-size
	SourceAddrs int // --source-map-size
	Frags       int // --frag-map-size
	// NodeIsolation holds the allowed entries of NodeIsolationPolicies: a
	// port range takes up to 30 keys per protocol.
	NodeIsolation int // --node-isolation-map-size
}

// mapCapacity is one sized map: its flag, default and accepted range.
type mapCapacity struct {
	name, flag    string
	def, min, max int
	size          func(*MapSizes) *int
	// pinned maps keep their entries across a resize.
	pinned bool
}

// capacities lists the sized maps. The endpoints map cannot outgrow the
// endpoint state map (maxEndpoints).
var capacities = []mapCapacity{
	{bpf.CoordinoMapCdoEndpoints, "endpoints-map-size", 1 << 16, 4, maxEndpoints, func(s *MapSizes) *int { return &s.Endpoints }, true},
	{bpf.CoordinoMapCdoIpcache, "ipcache-map-size", 1 << 21, 4, 1 << 24, func(s *MapSizes) *int { return &s.Ipcache }, true},
	{bpf.CoordinoMapCdoPolicy, "policy-map-size", 1 << 20, 4, 1 << 24, func(s *MapSizes) *int { return &s.Policy }, true},
	{bpf.CoordinoMapCdoEpAddrs, "source-map-size", 1 << 18, 4, 1 << 22, func(s *MapSizes) *int { return &s.SourceAddrs }, true},
	{bpf.CoordinoMapCdoFrags, "frag-map-size", 1 << 14, 64, 1 << 20, func(s *MapSizes) *int { return &s.Frags }, false},
	{bpf.CoordinoMapCdoNodeiso, "node-isolation-map-size", 1 << 12, 4, 1 << 20, func(s *MapSizes) *int { return &s.NodeIsolation }, true},
}

// DefaultMapSizes returns the default capacities.
func DefaultMapSizes() MapSizes {
	var s MapSizes
	for _, c := range capacities {
		*c.size(&s) = c.def
	}
	return s
}

// Validate checks every size against its range; errors name the flag.
func (s MapSizes) Validate() error {
	for _, c := range capacities {
		if v := *c.size(&s); v != 0 && (v < c.min || v > c.max) {
			return fmt.Errorf("%s %d: want %d to %d", c.flag, v, c.min, c.max)
		}
	}
	return nil
}

// MapSizeFlag names the flag that sizes a map ("" for maps without one).
func MapSizeFlag(name string) string {
	if name == bpf.CoordinoMapCdoConntrack {
		return "conntrack-size"
	}
	for _, c := range capacities {
		if c.name == name {
			return c.flag
		}
	}
	return ""
}

// MapFullError is a write a map refused because it is at capacity.
type MapFullError struct {
	Map      string
	Capacity int
}

func (e *MapFullError) Error() string {
	if flag := MapSizeFlag(e.Map); flag != "" {
		return fmt.Sprintf("BPF map %s is full (capacity %d): raise --%s", e.Map, e.Capacity, flag)
	}
	return fmt.Sprintf("BPF map %s is full (capacity %d)", e.Map, e.Capacity)
}

// DatapathFull marks the error as a dpapi.FullError: the endpoint manager
// answers it with "try again later".
func (e *MapFullError) DatapathFull() {}

// Refusal reasons (label reason of coordino_bpf_map_update_failures_total).
const (
	refusedFull   = "full"      // at capacity (hash: E2BIG, LPM trie: ENOSPC)
	refusedMemory = "no-memory" // the kernel could not allocate the entry
	refusedOther  = "error"
)

func refusalReason(err error) string {
	switch {
	case errors.Is(err, unix.E2BIG), errors.Is(err, unix.ENOSPC):
		return refusedFull
	case errors.Is(err, unix.ENOMEM):
		return refusedMemory
	}
	return refusedOther
}

// refusedMaps are the maps whose failures are counted and fail closed.
var refusedMaps = []string{bpf.CoordinoMapCdoEndpoints, bpf.CoordinoMapCdoIpcache, bpf.CoordinoMapCdoPolicy, bpf.CoordinoMapCdoEpAddrs,
	bpf.CoordinoMapCdoNodeiso}

// hostPathMaps are host routing's maps: an entry that does not fit leaves
// its traffic on the host's forwarding path, where policy applies as well,
// so their failures are counted but fail nothing (no size flag either).
var hostPathMaps = []string{bpf.CoordinoMapCdoLocalEps, bpf.CoordinoMapCdoPeerBlocks, bpf.CoordinoMapCdoTunnelPeers}

// mapEpisode is a map's refusals since it last took an entry.
type mapEpisode struct {
	open     bool
	failures uint64 // refused writes since start
}

// mapHealth is every map's record of refused writes: the parts that write
// maps report each refusal and each accepted insert, and it counts them,
// logs an episode's first refusal and says which maps refuse still.
// Callers hold the datapath's lock.
type mapHealth struct {
	log      *zap.Logger
	episodes map[string]*mapEpisode
	// failures is coordino_bpf_map_update_failures_total.
	failures *prometheus.CounterVec
}

func newMapHealth(log *zap.Logger) *mapHealth {
	h := &mapHealth{log: log, episodes: map[string]*mapEpisode{}, failures: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "coordino_bpf_map_update_failures_total",
		Help: "Writes a BPF map refused, by map and reason (full: at capacity; no-memory; error). Every one fails closed, but those of host routing's maps (cdo_local_eps, cdo_peer_blocks, cdo_tunnel_peers), whose traffic takes the host's forwarding path instead.",
	}, []string{"map", "reason"})}
	for _, name := range slices.Concat(refusedMaps, hostPathMaps) {
		h.failures.WithLabelValues(name, refusedFull)
	}
	return h
}

// refused counts a write m refused and returns err, as a *MapFullError when
// the map is full. The first refusal of an episode is logged: as failing
// closed, or for hostPathMaps as the fallback to the host's path it is.
func (h *mapHealth) refused(m *ebpf.Map, name string, err error) error {
	reason := refusalReason(err)
	h.failures.WithLabelValues(name, reason).Inc()
	ep := h.episodes[name]
	if ep == nil {
		ep = &mapEpisode{}
		h.episodes[name] = ep
	}
	ep.failures++
	if reason == refusedFull {
		err = fmt.Errorf("%w: %w", &MapFullError{Map: name, Capacity: int(m.MaxEntries())}, err)
	}
	if ep.open {
		return err
	}
	ep.open = true
	fields := []zap.Field{zap.String("map", name), zap.String("reason", reason), zap.Uint32("capacity", m.MaxEntries())}
	if slices.Contains(hostPathMaps, name) {
		h.log.Warn("BPF map refused an update: what does not fit takes the host's forwarding path", append(fields, zap.Error(err))...)
	} else {
		h.log.Error("BPF map refused an update: failing closed until it takes entries again",
			append(fields, zap.String("raise", "--"+MapSizeFlag(name)), zap.Error(err))...)
	}
	return err
}

// accepted ends name's episode after a successful insert.
func (h *mapHealth) accepted(name string) {
	if ep := h.episodes[name]; ep != nil && ep.open {
		ep.open = false
		h.log.Info("BPF map takes entries again", zap.String("map", name))
	}
}

// report fills u's refusals: a map refuses while it refused a write and
// has not taken one since, and is still full or has writes pending (of
// which pending says how many).
func (h *mapHealth) report(u *MapUsage, pending int) {
	ep := h.episodes[u.Name]
	if ep == nil {
		return
	}
	u.UpdateFailures = ep.failures
	if !ep.open {
		return
	}
	if u.Entries < u.Capacity && pending == 0 {
		h.accepted(u.Name)
		return
	}
	u.Refusing = true
}

// resizedMap holds the entries of a pinned map replaced by one of another
// capacity until they are copied into it.
type resizedMap struct {
	name, pin  string
	keys, vals [][]byte
}

// sizeMaps sets the capacities in spec and takes out pinned maps of another
// capacity, returning their entries for restoreResized. A map with more
// entries than its new capacity is an error naming the flag.
func sizeMaps(cfg *Config, spec *ebpf.CollectionSpec, log *zap.Logger) ([]resizedMap, error) {
	if err := cfg.MapSizes.Validate(); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	var out []resizedMap
	for _, c := range capacities {
		size := *c.size(&cfg.MapSizes)
		if size == 0 {
			size = c.def
			*c.size(&cfg.MapSizes) = size
		}
		ms := spec.Maps[c.name]
		ms.MaxEntries = uint32(size)
		if !c.pinned {
			continue
		}
		r, err := takeResized(filepath.Join(cfg.BPFDir, c.name), ms, c.flag, log)
		if err != nil {
			return nil, err
		}
		if r != nil {
			out = append(out, *r)
		}
	}
	for name, n := range cfg.testCapacities {
		spec.Maps[name].MaxEntries = n
	}
	// Only once every map fits: the old maps keep serving the attached
	// programs until they are re-attached to the new ones.
	for _, r := range out {
		if err := os.Remove(r.pin); err != nil {
			return nil, fmt.Errorf("datapath: remove pinned %s: %w", r.name, err)
		}
	}
	return out, nil
}

func takeResized(pin string, ms *ebpf.MapSpec, flag string, log *zap.Logger) (*resizedMap, error) {
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("datapath: open pinned %s: %w", ms.Name, err)
	}
	defer m.Close()
	if m.Type() != ms.Type || m.KeySize() != ms.KeySize || m.ValueSize() != ms.ValueSize || m.MaxEntries() == ms.MaxEntries {
		return nil, nil // same capacity, or a layout change Open reports
	}
	r := &resizedMap{name: ms.Name}
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(k, v) {
		r.keys, r.vals = append(r.keys, slices.Clone(k)), append(r.vals, slices.Clone(v))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("datapath: read pinned %s: %w", ms.Name, err)
	}
	if len(r.keys) > int(ms.MaxEntries) {
		return nil, fmt.Errorf("datapath: %s holds %d entries, more than --%s %d", ms.Name, len(r.keys), flag, ms.MaxEntries)
	}
	log.Info("resizing pinned BPF map: its entries move to the new map", zap.String("map", ms.Name),
		zap.Uint32("oldCapacity", m.MaxEntries()), zap.Uint32("newCapacity", ms.MaxEntries), zap.Int("entries", len(r.keys)))
	r.pin = pin
	return r, nil
}

// restoreResized copies the entries of resized maps into the new maps,
// before any program uses them.
func restoreResized(objs *bpf.CoordinoObjects, resized []resizedMap) error {
	byName := map[string]*ebpf.Map{
		bpf.CoordinoMapCdoEndpoints: objs.CdoEndpoints, bpf.CoordinoMapCdoIpcache: objs.CdoIpcache,
		bpf.CoordinoMapCdoPolicy: objs.CdoPolicy, bpf.CoordinoMapCdoEpAddrs: objs.CdoEpAddrs,
		bpf.CoordinoMapCdoNodeiso: objs.CdoNodeiso,
	}
	for _, r := range resized {
		for i := range r.keys {
			if err := byName[r.name].Update(r.keys[i], r.vals[i], ebpf.UpdateAny); err != nil {
				return fmt.Errorf("datapath: copy %s into its resized map: %w", r.name, err)
			}
		}
	}
	return nil
}

// withholdPrefixes keeps the ipcache fail-closed when wanted ipBlock
// prefixes are missing (the trie refused them): an address inside a
// missing prefix would otherwise resolve to a shorter installed one, whose
// identity policy may allow where the missing one is an exception. Every
// installed prefix that contains a missing one is removed (and stays
// pending), so such addresses resolve to a longer installed prefix or to
// the world identity, which no rule names. Callers hold mu.
func (mw *mapWriter) withholdPrefixes(w *wanted) {
	var missing []netip.Prefix
	for p := range mw.dirty.ips {
		if w.isOwner(p) {
			continue // a missing pod or node address resolves to its own CIDR identity
		}
		if want, ok := w.ip(p); ok && mw.mirror.ipcache[p] != want {
			missing = append(missing, p)
		}
	}
	for _, q := range missing {
		for bits := q.Bits() - 1; bits >= 0; bits-- {
			p := netip.PrefixFrom(q.Addr(), bits).Masked()
			if _, ok := mw.mirror.ipcache[p]; !ok {
				continue
			}
			k := ipcacheKey(p)
			if err := deleteKey(mw.maps.ipcache, &k); err != nil {
				mw.log.Error("ipcache prefix containing a missing one not withheld", zap.Stringer("prefix", p), zap.Error(err))
				continue
			}
			mw.log.Warn("ipcache prefix withheld: a prefix inside it does not fit", zap.Stringer("prefix", p), zap.Stringer("missing", q))
			delete(mw.mirror.ipcache, p)
			mw.dirty.ips[p] = struct{}{}
		}
	}
}

// containsMissing reports whether p strictly contains a prefix in missing.
func containsMissing(p netip.Prefix, missing []netip.Prefix) bool {
	for _, q := range missing {
		if q.Bits() > p.Bits() && p.Contains(q.Addr()) {
			return true
		}
	}
	return false
}

// mapName names one of the maps the daemon writes.
func (mw *mapWriter) mapName(m *ebpf.Map) string {
	switch m {
	case mw.maps.endpoints:
		return bpf.CoordinoMapCdoEndpoints
	case mw.maps.ipcache:
		return bpf.CoordinoMapCdoIpcache
	case mw.maps.policy:
		return bpf.CoordinoMapCdoPolicy
	}
	return "unknown"
}

// AttachCapacity returns a *MapFullError when the maps every new endpoint
// needs an entry in (endpoints, source addresses) are full, so STATUS can
// say the node cannot take pods before an ADD fails.
func (d *Datapath) AttachCapacity() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	// The endpoints map, then the source addresses.
	for _, u := range []MapUsage{d.mw.usage()[0], d.eps.usage()[0]} {
		if u.Entries >= u.Capacity {
			return &MapFullError{Map: u.Name, Capacity: u.Capacity}
		}
	}
	return nil
}
