package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// The map writer, last stage of the policy pipeline. The engine reports
// which outputs an operation touched; they join the pending set, and flush
// compares each pending entry's wanted value with the mirror of the map and
// writes only the differences. Nothing is recompiled here.
//
// Fail closed. A flush that stops part-way (map full, ENOMEM) must never
// leave the node more permissive than both the state before and the state
// wanted. Each write is classed by its effect on the installed state:
//
//	A  allow entries whose (identity, direction) no installed endpoint
//	   isolates: they change no verdict yet (this is how a newly isolated
//	   endpoint gets its allows before its isolation, without a gap);
//	B  tightening: isolation bits added, endpoints removed, pod addresses
//	   removed from the ipcache, allow entries removed where the direction
//	   stays isolated;
//	C  loosening: other allow entries, new or changed ipcache entries,
//	   new endpoints, isolation bits cleared, ipBlock prefixes removed;
//	D  allow entries of directions that are no longer isolated.
//
// and the classes run in that order. While B runs the state only tightens
// (⊆ before); from C on it only loosens towards the wanted state (⊆ wanted);
// a flow allowed at one endpoint by the old state and at the other by the
// new one cannot slip through. If any B write fails, C and D are not
// attempted. A failed write stays pending, the error is reported and the
// flush is retried with backoff. Because removals (B) run even when
// additions (A) fail, a map that was full of stale entries drains, so a
// later flush does not fail at the same point forever.

// pending is what flush still has to bring in line with the engine.
type pending struct {
	keys map[policy.Key]struct{}
	ips  map[netip.Prefix]struct{}
	eps  map[uint32]struct{}
}

func newPending() pending {
	return pending{keys: map[policy.Key]struct{}{}, ips: map[netip.Prefix]struct{}{}, eps: map[uint32]struct{}{}}
}

func (p pending) empty() bool { return len(p.keys) == 0 && len(p.ips) == 0 && len(p.eps) == 0 }

// mapWriter owns the maps policy is enforced from (policy, ipcache,
// endpoints) and the config map: what it believes they hold (the mirror),
// what may differ from the wanted state (dirty) and the revision and flags
// it last wrote. Callers hold the datapath's lock.
type mapWriter struct {
	maps   writerMaps
	health *mapHealth
	retry  *retrier
	log    *zap.Logger
	// syncFailures is coordino_policy_map_update_failures_total.
	syncFailures prometheus.Counter

	mirror *mirrors
	// dirty are map entries that may differ from what the engine wants.
	dirty    pending
	revision uint32
	// cfgFlags are the CFG_* flags last written to the config map.
	cfgFlags uint32
	// full: the next flush compares every entry (markAll).
	full bool
}

// writerMaps are the maps the map writer writes.
type writerMaps struct {
	policy, ipcache, endpoints, config *ebpf.Map
}

// openMapWriter adopts what the maps hold: the mirrors, and the revision
// and flags of the previous daemon, kept until startup decides
// (SetEmitAllowed), so allowed flows it logged keep queueing meanwhile.
func openMapWriter(maps writerMaps, health *mapHealth, retry *retrier, log *zap.Logger) (*mapWriter, error) {
	m, err := readMirrors(maps)
	if err != nil {
		return nil, err
	}
	var cfg bpf.CoordinoConfig
	if err := maps.config.Lookup(uint32(0), &cfg); err != nil {
		return nil, fmt.Errorf("datapath: read config map: %w", err)
	}
	return &mapWriter{maps: maps, health: health, retry: retry, log: log, mirror: m, dirty: newPending(),
		revision: cfg.PolicyRevision, cfgFlags: cfg.Flags, full: true,
		syncFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordino_policy_map_update_failures_total",
			Help: "Policy map updates that failed part-way (fail-closed; retried with backoff).",
		})}, nil
}

// desired is what the maps should hold, from the parts that know it: the
// policy engine's output, the local endpoints, the node's and other nodes'
// addresses and the remote pods. A flush reads it and never writes it.
type desired struct {
	engine        *policy.Engine
	eps           *endpoints
	nodeIPs       []netip.Addr // the host identity
	remoteNodeIPs []netip.Addr // the remote-node identity
	remote        *remoteAddrs
}

// markAddr queues a's ipcache entry.
func (mw *mapWriter) markAddr(a netip.Addr) {
	a = a.Unmap()
	mw.dirty.ips[netip.PrefixFrom(a, a.BitLen())] = struct{}{}
}

// markEndpoint queues r's endpoint entry and addresses.
func (mw *mapWriter) markEndpoint(r *record) {
	mw.dirty.eps[uint32(r.HostIfIndex)] = struct{}{}
	for _, ip := range r.IPs {
		mw.markAddr(ip)
	}
}

// markAll queues every entry the maps hold or should hold: after a restart
// (the engine starts empty, the maps do not) the first flush is a full one.
// The datapath flushes only once the first policy snapshot is in the
// engine, so that flush is the snapshot's.
func (mw *mapWriter) markAll(in desired) {
	for k := range mw.mirror.policy {
		mw.dirty.keys[k] = struct{}{}
	}
	in.engine.Keys(func(k policy.Key) { mw.dirty.keys[k] = struct{}{} })
	for p := range mw.mirror.ipcache {
		mw.dirty.ips[p] = struct{}{}
	}
	in.engine.Prefixes(func(p netip.Prefix, _ identity.ID) { mw.dirty.ips[p] = struct{}{} })
	for _, ip := range slices.Concat(in.nodeIPs, in.remoteNodeIPs) {
		mw.markAddr(ip)
	}
	in.remote.each(mw.markAddr)
	for ifindex := range mw.mirror.endpoints {
		mw.dirty.eps[ifindex] = struct{}{}
	}
	for r := range in.eps.all() {
		mw.markEndpoint(r)
	}
}

// wanted is the desired content of the small maps, built per flush from the
// endpoints (hundreds at most), never from the policy set.
type wanted struct {
	in     desired
	byIf   map[uint32]*record
	owners map[netip.Addr]identity.ID
	// installedIso ORs the installed isolation of each identity's endpoints.
	installedIso map[identity.ID]policy.Isolation
}

func (mw *mapWriter) wanted(in desired) *wanted {
	w := &wanted{in: in, byIf: map[uint32]*record{}, owners: map[netip.Addr]identity.ID{},
		installedIso: map[identity.ID]policy.Isolation{}}
	for _, ip := range in.remoteNodeIPs {
		w.owners[ip.Unmap()] = identity.RemoteNode
	}
	for _, ip := range in.nodeIPs {
		w.owners[ip.Unmap()] = identity.Host
	}
	for r := range in.eps.all() {
		w.byIf[uint32(r.HostIfIndex)] = r
		for _, ip := range r.IPs {
			w.owners[ip] = r.Identity
		}
	}
	for _, v := range mw.mirror.endpoints {
		w.installedIso[identity.ID(v.Identity)] |= policy.Isolation(v.Flags)
	}
	return w
}

func (w *wanted) endpoint(ifindex uint32) (bpf.CoordinoEndpointInfo, bool) {
	r := w.byIf[ifindex]
	if r == nil {
		return bpf.CoordinoEndpointInfo{}, false
	}
	return bpf.CoordinoEndpointInfo{Identity: uint32(r.Identity), Flags: uint32(w.in.engine.Isolation(r.Identity))}, true
}

func (w *wanted) ip(p netip.Prefix) (bpf.CoordinoIpcacheValue, bool) {
	if p.IsSingleIP() {
		id, ok := w.owners[p.Addr()]
		if !ok {
			id, ok = w.in.remote.identity(p.Addr()) // local endpoints win
		}
		if ok {
			return bpf.CoordinoIpcacheValue{Identity: uint32(id), CidrIdentity: uint32(w.in.engine.CIDRIdentity(p.Addr()))}, true
		}
	}
	if id, ok := w.in.engine.PrefixIdentity(p); ok {
		return bpf.CoordinoIpcacheValue{Identity: uint32(id), CidrIdentity: uint32(id)}, true
	}
	return bpf.CoordinoIpcacheValue{}, false
}

// isOwner reports whether p is the address of a local pod or of the node.
func (w *wanted) isOwner(p netip.Prefix) bool {
	_, ok := w.owners[p.Addr()]
	return ok && p.IsSingleIP()
}

// write is one map operation of a flush.
type write struct {
	what   string
	m      *ebpf.Map
	do     func() error
	done   func() // on success: update the mirror, clear pending
	insert bool   // adds or changes an entry (else removes one)
	// prefix is set on ipcache inserts of ipBlock prefixes (see withholdPrefixes).
	prefix netip.Prefix
}

// collectChanges moves what the engine touched into the pending set: keys
// as they are, isolation changes to the endpoints of the identity, prefix
// changes to the prefix and every local address inside it (its CIDR
// identity may change).
func (mw *mapWriter) collectChanges(in desired) {
	ch := in.engine.TakeChanges()
	for _, err := range in.engine.TakeErrors() {
		mw.log.Error("policy not fully applied", zap.Error(err))
	}
	for k := range ch.Keys {
		mw.dirty.keys[k] = struct{}{}
	}
	if len(ch.Isolation) > 0 {
		for r := range in.eps.all() {
			if _, ok := ch.Isolation[r.Identity]; ok {
				mw.dirty.eps[uint32(r.HostIfIndex)] = struct{}{}
			}
		}
	}
	for p := range ch.Prefixes {
		mw.dirty.ips[p] = struct{}{}
		for _, ip := range slices.Concat(in.nodeIPs, in.remoteNodeIPs) {
			if p.Contains(ip.Unmap()) {
				mw.markAddr(ip)
			}
		}
		for r := range in.eps.all() {
			for _, ip := range r.IPs {
				if p.Contains(ip) {
					mw.markAddr(ip)
				}
			}
		}
		// Remote pods' entries carry their CIDR identity too, or ipBlock
		// rules would stop matching them once their pod identity is known.
		in.remote.inside(p, mw.markAddr)
	}
}

// flush writes the pending entries in fail-closed order (see the top of
// this file): classify them into a plan, apply it, then report. Failed
// writes stay pending and a retry is scheduled.
func (mw *mapWriter) flush(in desired) error {
	if mw.full {
		mw.full = false
		mw.markAll(in)
	}
	mw.collectChanges(in)
	if mw.dirty.empty() {
		return nil
	}
	w := mw.wanted(in)
	plan := mw.classify(w)
	changed, errs := mw.apply(plan)
	if len(mw.dirty.ips) > 0 {
		mw.withholdPrefixes(w)
	}
	return mw.finishFlush(changed, errs)
}

// flushPlan is one flush's writes, classed by their effect on the installed
// state (the classes A-D at the top of this file). apply runs the fields in
// the order they are declared, and that order is what keeps every
// intermediate state no more permissive than both the installed and the
// wanted one: the inert allows and the tightening writes run first, the
// loosening ones only once every tightening write succeeded, and the
// allows of directions no longer isolated last, once everything before
// them is in. Reordering the fields or the phases of apply breaks this.
type flushPlan struct {
	// inertAllows (A) are allow entries whose (identity, direction) no
	// installed endpoint isolates: they change no verdict yet.
	inertAllows []write
	// tighten (B): isolation bits added, endpoints removed, pod addresses
	// leaving the ipcache, allows removed where the direction stays
	// isolated. A failure here stops the plan before anything loosens.
	tighten []write
	// loosen (C): other allow entries, new or changed endpoints and
	// ipcache entries, isolation bits cleared.
	loosen []write
	// prefixes (C) are ipBlock prefixes to insert, longest first, so none
	// goes in while a prefix inside it is missing.
	prefixes []write
	// prefixRemovals (C, late): a prefix leaving hands its addresses to a
	// shorter prefix, which may allow where it was excepted.
	prefixRemovals []write
	// liftedAllows (D) are allow entries removed from directions no longer
	// isolated: only once all of C is in.
	liftedAllows []write
}

// classify drops pending entries that already hold their wanted value and
// sorts the writes of the others into a plan.
func (mw *mapWriter) classify(w *wanted) *flushPlan {
	var plan flushPlan
	for k := range mw.dirty.keys {
		want := w.in.engine.WantsKey(k)
		var wv policy.Value
		if want {
			wv = w.in.engine.KeyValue(k)
		}
		hv, have := mw.mirror.policy[k]
		// Tier keys (policy/tiers.go) are classed by their action: a
		// Deny tightens when it comes and loosens when it goes; Accept,
		// Pass and NetworkPolicy allows the other way round.
		dir := k.Dir &^ policy.DirBaseline
		switch {
		case want == have && wv == hv:
			delete(mw.dirty.keys, k)
		case want && !w.installedIso[k.Local].Enforced(dir):
			plan.inertAllows = append(plan.inertAllows, mw.policyAdd(k, wv))
		case want && wv.HasDeny() && !hv.HasDeny():
			plan.tighten = append(plan.tighten, mw.policyAdd(k, wv))
		case want:
			plan.loosen = append(plan.loosen, mw.policyAdd(k, wv))
		case hv.HasDeny():
			plan.loosen = append(plan.loosen, mw.policyDelete(k))
		case w.in.engine.Isolation(k.Local).Enforced(dir):
			plan.tighten = append(plan.tighten, mw.policyDelete(k))
		default:
			plan.liftedAllows = append(plan.liftedAllows, mw.policyDelete(k))
		}
	}
	for ifindex := range mw.dirty.eps {
		want, ok := w.endpoint(ifindex)
		have, had := mw.mirror.endpoints[ifindex]
		switch {
		case ok == had && want == have:
			delete(mw.dirty.eps, ifindex)
		case !ok:
			plan.tighten = append(plan.tighten, mw.endpointDelete(ifindex))
		case !had || want.Identity != have.Identity:
			plan.loosen = append(plan.loosen, mw.endpointWrite(ifindex, want, true))
		case want.Flags&^have.Flags != 0 && have.Flags&^want.Flags != 0:
			// Isolation added in one direction and cleared in the other:
			// add first (B), clear later (C).
			both := bpf.CoordinoEndpointInfo{Identity: want.Identity, Flags: want.Flags | have.Flags}
			plan.tighten = append(plan.tighten, mw.endpointWrite(ifindex, both, false))
			plan.loosen = append(plan.loosen, mw.endpointWrite(ifindex, want, true))
		case want.Flags&^have.Flags != 0:
			plan.tighten = append(plan.tighten, mw.endpointWrite(ifindex, want, true))
		default:
			plan.loosen = append(plan.loosen, mw.endpointWrite(ifindex, want, true))
		}
	}
	for p := range mw.dirty.ips {
		want, ok := w.ip(p)
		have, had := mw.mirror.ipcache[p]
		switch {
		case ok == had && want == have:
			delete(mw.dirty.ips, p)
		case ok && !w.isOwner(p):
			x := mw.ipcacheWrite(p, want)
			x.prefix = p
			plan.prefixes = append(plan.prefixes, x)
		case ok:
			plan.loosen = append(plan.loosen, mw.ipcacheWrite(p, want))
		case p.IsSingleIP():
			// An address leaving falls back to its CIDR identity: fewer
			// rules can match it.
			plan.tighten = append(plan.tighten, mw.ipcacheDelete(p))
		default:
			plan.prefixRemovals = append(plan.prefixRemovals, mw.ipcacheDelete(p))
		}
	}
	slices.SortFunc(plan.prefixes, func(x, y write) int { return y.prefix.Bits() - x.prefix.Bits() })
	return &plan
}

// apply runs plan in fail-closed order (flushPlan). It reports whether any
// write succeeded and the errors of those that did not; those stay pending.
func (mw *mapWriter) apply(plan *flushPlan) (changed bool, errs []error) {
	// Prefixes not in yet: a prefix containing one is withheld.
	var missing []netip.Prefix
	for _, x := range plan.prefixes {
		missing = append(missing, x.prefix)
	}
	run := func(ws []write) bool {
		ok := true
		for _, x := range ws {
			if x.prefix.IsValid() && containsMissing(x.prefix, missing) {
				ok = false
				continue // stays pending: withheld until the prefixes inside it fit
			}
			if err := x.do(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", x.what, mw.health.refused(x.m, mw.mapName(x.m), err)))
				ok = false
				continue
			}
			x.done()
			if x.prefix.IsValid() {
				missing = slices.DeleteFunc(missing, func(q netip.Prefix) bool { return q == x.prefix })
			}
			if x.insert {
				mw.health.accepted(mw.mapName(x.m))
			}
			changed = true
		}
		return ok
	}
	run(plan.inertAllows)
	if !run(plan.tighten) {
		return changed, errs
	}
	// Later isolation-clearing writes depend on nothing in A: a failed
	// allow addition only leaves the endpoint stricter than wanted.
	loosened := run(plan.loosen)
	prefixed := run(plan.prefixes)
	// Prefixes leave even when others did not fit, so a trie full of
	// stale prefixes drains; withholdPrefixes keeps the result closed.
	if run(plan.prefixRemovals) && loosened && prefixed {
		run(plan.liftedAllows)
	}
	return changed, errs
}

// finishFlush bumps the revision after any change and reports the failed
// writes, scheduling a retry, or ends the backoff.
func (mw *mapWriter) finishFlush(changed bool, errs []error) error {
	if changed {
		if berr := mw.bumpRevision(); berr != nil {
			errs = append(errs, berr)
		}
	}
	if len(errs) == 0 {
		mw.retry.done()
		return nil
	}
	mw.syncFailures.Inc()
	mw.retry.schedule()
	return fmt.Errorf("policy maps not fully updated (%d writes failed, %d entries pending, retrying): %w",
		len(errs), len(mw.dirty.keys)+len(mw.dirty.ips)+len(mw.dirty.eps), errors.Join(firstErrors(errs, 3)...))
}

func firstErrors(errs []error, n int) []error {
	if len(errs) > n {
		return append(errs[:n:n], fmt.Errorf("and %d more", len(errs)-n))
	}
	return errs
}

// policyRevision is the revision last written to the config map.
func (mw *mapWriter) policyRevision() uint32 { return mw.revision }

// hasCfgFlag reports whether flag is set in the config map.
func (mw *mapWriter) hasCfgFlag(flag uint32) bool { return mw.cfgFlags&flag != 0 }

// settled reports whether no write is pending.
func (mw *mapWriter) settled() bool { return mw.dirty.empty() }

func (mw *mapWriter) policyAdd(k policy.Key, v policy.Value) write {
	return write{
		what: fmt.Sprintf("add policy entry %v value %#x (map holds %d)", k, uint32(v), len(mw.mirror.policy)),
		m:    mw.maps.policy, insert: true,
		do: func() error {
			bk := policyKey(k)
			return mw.maps.policy.Update(&bk, &bpf.CoordinoPolicyValue{Flags: uint32(v)}, ebpf.UpdateAny)
		},
		done: func() { mw.mirror.policy[k] = v; delete(mw.dirty.keys, k) },
	}
}

func (mw *mapWriter) policyDelete(k policy.Key) write {
	return write{
		what: fmt.Sprintf("delete policy entry %v", k),
		m:    mw.maps.policy,
		do: func() error {
			bk := policyKey(k)
			return deleteKey(mw.maps.policy, &bk)
		},
		done: func() { delete(mw.mirror.policy, k); delete(mw.dirty.keys, k) },
	}
}

// endpointWrite writes v; final says whether v is the wanted value (else a
// step towards it, and the entry stays pending).
func (mw *mapWriter) endpointWrite(ifindex uint32, v bpf.CoordinoEndpointInfo, final bool) write {
	return write{
		what: fmt.Sprintf("update endpoint ifindex %d", ifindex),
		m:    mw.maps.endpoints, insert: true,
		do: func() error { return mw.maps.endpoints.Update(&ifindex, &v, ebpf.UpdateAny) },
		done: func() {
			mw.mirror.endpoints[ifindex] = v
			if final {
				delete(mw.dirty.eps, ifindex)
			}
		},
	}
}

func (mw *mapWriter) endpointDelete(ifindex uint32) write {
	return write{
		what: fmt.Sprintf("delete endpoint ifindex %d", ifindex),
		m:    mw.maps.endpoints,
		do:   func() error { return deleteKey(mw.maps.endpoints, &ifindex) },
		done: func() { delete(mw.mirror.endpoints, ifindex); delete(mw.dirty.eps, ifindex) },
	}
}

func (mw *mapWriter) ipcacheWrite(p netip.Prefix, v bpf.CoordinoIpcacheValue) write {
	return write{
		what: fmt.Sprintf("update ipcache %s", p),
		m:    mw.maps.ipcache, insert: true,
		do: func() error {
			k := ipcacheKey(p)
			return mw.maps.ipcache.Update(&k, &v, ebpf.UpdateAny)
		},
		done: func() { mw.mirror.ipcache[p] = v; delete(mw.dirty.ips, p) },
	}
}

func (mw *mapWriter) ipcacheDelete(p netip.Prefix) write {
	return write{
		what: fmt.Sprintf("delete ipcache %s", p),
		m:    mw.maps.ipcache,
		do: func() error {
			k := ipcacheKey(p)
			return deleteKey(mw.maps.ipcache, &k)
		},
		done: func() { delete(mw.mirror.ipcache, p); delete(mw.dirty.ips, p) },
	}
}

// endpointPending reports whether anything of r is not in the maps yet.
func (mw *mapWriter) endpointPending(r *record) bool {
	if _, ok := mw.dirty.eps[uint32(r.HostIfIndex)]; ok {
		return true
	}
	for _, ip := range r.IPs {
		if _, ok := mw.dirty.ips[netip.PrefixFrom(ip, ip.BitLen())]; ok {
			return true
		}
	}
	for k := range mw.dirty.keys {
		if k.Local == r.Identity {
			return true
		}
	}
	return false
}

// syncEndpointsOnly removes map entries of detached endpoints without
// recompiling; used before the first policy snapshot arrives.
func (mw *mapWriter) syncEndpointsOnly(eps *endpoints) error {
	live := map[uint32]bool{}
	addrs := map[netip.Prefix]bool{}
	for r := range eps.all() {
		live[uint32(r.HostIfIndex)] = true
		for _, ip := range r.IPs {
			addrs[netip.PrefixFrom(ip, ip.BitLen())] = true
		}
	}
	for ifindex := range mw.mirror.endpoints {
		if live[ifindex] {
			continue
		}
		if err := deleteKey(mw.maps.endpoints, &ifindex); err != nil {
			return fmt.Errorf("delete endpoint ifindex %d: %w", ifindex, err)
		}
		delete(mw.mirror.endpoints, ifindex)
	}
	for p, v := range mw.mirror.ipcache {
		id := identity.ID(v.Identity)
		if addrs[p] || id.IsCIDR() || id == identity.Host || id == identity.RemoteNode {
			continue
		}
		k := ipcacheKey(p)
		if err := deleteKey(mw.maps.ipcache, &k); err != nil {
			return fmt.Errorf("delete ipcache %s: %w", p, err)
		}
		delete(mw.mirror.ipcache, p)
	}
	return mw.bumpRevision()
}

func (mw *mapWriter) bumpRevision() error {
	mw.revision++
	if err := mw.writeConfig(); err != nil {
		return fmt.Errorf("update policy revision: %w", err)
	}
	return nil
}

// writeConfig stores the revision and flags; callers hold mu, so neither
// write can undo the other.
func (mw *mapWriter) writeConfig() error {
	cfg := bpf.CoordinoConfig{PolicyRevision: mw.revision, Flags: mw.cfgFlags}
	return mw.maps.config.Update(uint32(0), &cfg, ebpf.UpdateAny)
}

// setCfgFlags sets the CFG_* flags in mask to those of set in the config
// map, reporting whether they changed.
func (mw *mapWriter) setCfgFlags(mask, set uint32) (bool, error) {
	flags := mw.cfgFlags&^mask | set&mask
	if flags == mw.cfgFlags {
		return false, nil
	}
	old := mw.cfgFlags
	mw.cfgFlags = flags
	if err := mw.writeConfig(); err != nil {
		mw.cfgFlags = old
		return false, err
	}
	return true, nil
}

// setCfgFlag sets or clears one CFG_* flag (setCfgFlags).
func (mw *mapWriter) setCfgFlag(flag uint32, on bool) (bool, error) {
	var set uint32
	if on {
		set = flag
	}
	return mw.setCfgFlags(flag, set)
}

// pendingIn is how many writes to the map name are pending.
func (mw *mapWriter) pendingIn(name string) int {
	switch name {
	case bpf.CoordinoMapCdoEndpoints:
		return len(mw.dirty.eps)
	case bpf.CoordinoMapCdoIpcache:
		return len(mw.dirty.ips)
	case bpf.CoordinoMapCdoPolicy:
		return len(mw.dirty.keys)
	}
	return 0
}

// usage reports the fill of the maps it writes.
func (mw *mapWriter) usage() []MapUsage {
	return []MapUsage{
		{Name: bpf.CoordinoMapCdoEndpoints, Entries: len(mw.mirror.endpoints), Capacity: int(mw.maps.endpoints.MaxEntries())},
		{Name: bpf.CoordinoMapCdoIpcache, Entries: len(mw.mirror.ipcache), Capacity: int(mw.maps.ipcache.MaxEntries())},
		{Name: bpf.CoordinoMapCdoPolicy, Entries: len(mw.mirror.policy), Capacity: int(mw.maps.policy.MaxEntries())},
	}
}

// eachIpcache calls f for every entry the ipcache holds.
func (mw *mapWriter) eachIpcache(f func(netip.Prefix, bpf.CoordinoIpcacheValue)) {
	for p, v := range mw.mirror.ipcache {
		f(p, v)
	}
}
