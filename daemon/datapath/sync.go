package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
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

// Retry backoff after a failed flush.
const (
	defaultRetryDelay = time.Second
	maxRetryDelay     = 30 * time.Second
)

// markEndpoint queues r's endpoint entry and addresses.
func (d *Datapath) markEndpoint(r *record) {
	d.dirty.eps[uint32(r.HostIfIndex)] = struct{}{}
	for _, ip := range r.IPs {
		d.dirty.ips[netip.PrefixFrom(ip, ip.BitLen())] = struct{}{}
	}
}

// markAll queues every entry the maps hold or should hold: after a restart
// (the engine starts empty, the maps do not) the first flush is a full one.
func (d *Datapath) markAll() {
	for k := range d.mirror.policy {
		d.dirty.keys[k] = struct{}{}
	}
	d.engine.Keys(func(k policy.Key) { d.dirty.keys[k] = struct{}{} })
	for p := range d.mirror.ipcache {
		d.dirty.ips[p] = struct{}{}
	}
	d.engine.Prefixes(func(p netip.Prefix, _ identity.ID) { d.dirty.ips[p] = struct{}{} })
	for _, ip := range slices.Concat(d.cfg.NodeIPs, d.nodeIso.remoteIPs) {
		d.dirty.ips[netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen())] = struct{}{}
	}
	d.markRemote()
	for ifindex := range d.mirror.endpoints {
		d.dirty.eps[ifindex] = struct{}{}
	}
	for _, r := range d.eps {
		d.markEndpoint(r)
	}
}

// wanted is the desired content of the small maps, built per flush from the
// endpoints (hundreds at most), never from the policy set.
type wanted struct {
	d      *Datapath
	byIf   map[uint32]*record
	owners map[netip.Addr]identity.ID
	// installedIso ORs the installed isolation of each identity's endpoints.
	installedIso map[identity.ID]policy.Isolation
}

func (d *Datapath) wanted() *wanted {
	w := &wanted{d: d, byIf: map[uint32]*record{}, owners: map[netip.Addr]identity.ID{},
		installedIso: map[identity.ID]policy.Isolation{}}
	for _, ip := range d.nodeIso.remoteIPs {
		w.owners[ip.Unmap()] = identity.RemoteNode
	}
	for _, ip := range d.cfg.NodeIPs {
		w.owners[ip.Unmap()] = identity.Host
	}
	for _, r := range d.eps {
		w.byIf[uint32(r.HostIfIndex)] = r
		for _, ip := range r.IPs {
			w.owners[ip] = r.Identity
		}
	}
	for _, v := range d.mirror.endpoints {
		w.installedIso[identity.ID(v.Identity)] |= policy.Isolation(v.Flags)
	}
	return w
}

func (w *wanted) endpoint(ifindex uint32) (bpf.CoordinoEndpointInfo, bool) {
	r := w.byIf[ifindex]
	if r == nil {
		return bpf.CoordinoEndpointInfo{}, false
	}
	return bpf.CoordinoEndpointInfo{Identity: uint32(r.Identity), Flags: uint32(w.d.engine.Isolation(r.Identity))}, true
}

func (w *wanted) ip(p netip.Prefix) (bpf.CoordinoIpcacheValue, bool) {
	if p.IsSingleIP() {
		id, ok := w.owners[p.Addr()]
		if !ok {
			id, ok = w.d.remote.identity(p.Addr()) // local endpoints win
		}
		if ok {
			return bpf.CoordinoIpcacheValue{Identity: uint32(id), CidrIdentity: uint32(w.d.engine.CIDRIdentity(p.Addr()))}, true
		}
	}
	if id, ok := w.d.engine.PrefixIdentity(p); ok {
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
func (d *Datapath) collectChanges() {
	ch := d.engine.TakeChanges()
	for _, err := range d.engine.TakeErrors() {
		d.log.Error("policy not fully applied", zap.Error(err))
	}
	for k := range ch.Keys {
		d.dirty.keys[k] = struct{}{}
	}
	if len(ch.Isolation) > 0 {
		for _, r := range d.eps {
			if _, ok := ch.Isolation[r.Identity]; ok {
				d.dirty.eps[uint32(r.HostIfIndex)] = struct{}{}
			}
		}
	}
	for p := range ch.Prefixes {
		d.dirty.ips[p] = struct{}{}
		for _, ip := range slices.Concat(d.cfg.NodeIPs, d.nodeIso.remoteIPs) {
			if p.Contains(ip.Unmap()) {
				d.dirty.ips[netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen())] = struct{}{}
			}
		}
		for _, r := range d.eps {
			for _, ip := range r.IPs {
				if p.Contains(ip) {
					d.dirty.ips[netip.PrefixFrom(ip, ip.BitLen())] = struct{}{}
				}
			}
		}
		// Remote pods' entries carry their CIDR identity too, or ipBlock
		// rules would stop matching them once their pod identity is known.
		d.remote.inside(p, func(a netip.Addr) {
			d.dirty.ips[netip.PrefixFrom(a, a.BitLen())] = struct{}{}
		})
	}
}

// flush writes the pending entries in fail-closed order (see the top of
// this file): classify them into a plan, apply it, then report. Failed
// writes stay pending and a retry is scheduled.
func (d *Datapath) flush() error {
	d.collectChanges()
	if d.dirty.empty() {
		return nil
	}
	w := d.wanted()
	plan := d.classify(w)
	changed, errs := d.apply(plan)
	if len(d.dirty.ips) > 0 {
		d.withholdPrefixes(w)
	}
	return d.finishFlush(changed, errs)
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
func (d *Datapath) classify(w *wanted) *flushPlan {
	var plan flushPlan
	for k := range d.dirty.keys {
		want := d.engine.WantsKey(k)
		_, have := d.mirror.policy[k]
		switch {
		case want == have:
			delete(d.dirty.keys, k)
		case want && !w.installedIso[k.Local].Has(k.Dir):
			plan.inertAllows = append(plan.inertAllows, d.policyAdd(k))
		case want:
			plan.loosen = append(plan.loosen, d.policyAdd(k))
		case d.engine.Isolation(k.Local).Has(k.Dir):
			plan.tighten = append(plan.tighten, d.policyDelete(k))
		default:
			plan.liftedAllows = append(plan.liftedAllows, d.policyDelete(k))
		}
	}
	for ifindex := range d.dirty.eps {
		want, ok := w.endpoint(ifindex)
		have, had := d.mirror.endpoints[ifindex]
		switch {
		case ok == had && want == have:
			delete(d.dirty.eps, ifindex)
		case !ok:
			plan.tighten = append(plan.tighten, d.endpointDelete(ifindex))
		case !had || want.Identity != have.Identity:
			plan.loosen = append(plan.loosen, d.endpointWrite(ifindex, want, true))
		case want.Flags&^have.Flags != 0 && have.Flags&^want.Flags != 0:
			// Isolation added in one direction and cleared in the other:
			// add first (B), clear later (C).
			both := bpf.CoordinoEndpointInfo{Identity: want.Identity, Flags: want.Flags | have.Flags}
			plan.tighten = append(plan.tighten, d.endpointWrite(ifindex, both, false))
			plan.loosen = append(plan.loosen, d.endpointWrite(ifindex, want, true))
		case want.Flags&^have.Flags != 0:
			plan.tighten = append(plan.tighten, d.endpointWrite(ifindex, want, true))
		default:
			plan.loosen = append(plan.loosen, d.endpointWrite(ifindex, want, true))
		}
	}
	for p := range d.dirty.ips {
		want, ok := w.ip(p)
		have, had := d.mirror.ipcache[p]
		switch {
		case ok == had && want == have:
			delete(d.dirty.ips, p)
		case ok && !w.isOwner(p):
			x := d.ipcacheWrite(p, want)
			x.prefix = p
			plan.prefixes = append(plan.prefixes, x)
		case ok:
			plan.loosen = append(plan.loosen, d.ipcacheWrite(p, want))
		case p.IsSingleIP():
			// An address leaving falls back to its CIDR identity: fewer
			// rules can match it.
			plan.tighten = append(plan.tighten, d.ipcacheDelete(p))
		default:
			plan.prefixRemovals = append(plan.prefixRemovals, d.ipcacheDelete(p))
		}
	}
	slices.SortFunc(plan.prefixes, func(x, y write) int { return y.prefix.Bits() - x.prefix.Bits() })
	return &plan
}

// apply runs plan in fail-closed order (flushPlan). It reports whether any
// write succeeded and the errors of those that did not; those stay pending.
func (d *Datapath) apply(plan *flushPlan) (changed bool, errs []error) {
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
				errs = append(errs, fmt.Errorf("%s: %w", x.what, d.health.refused(x.m, d.mapName(x.m), err)))
				ok = false
				continue
			}
			x.done()
			if x.prefix.IsValid() {
				missing = slices.DeleteFunc(missing, func(q netip.Prefix) bool { return q == x.prefix })
			}
			if x.insert {
				d.health.accepted(d.mapName(x.m))
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
func (d *Datapath) finishFlush(changed bool, errs []error) error {
	if changed {
		if berr := d.bumpRevision(); berr != nil {
			errs = append(errs, berr)
		}
	}
	if len(errs) == 0 {
		d.retryDone()
		return nil
	}
	d.metrics.syncFailures.Inc()
	d.scheduleRetry()
	return fmt.Errorf("policy maps not fully updated (%d writes failed, %d entries pending, retrying): %w",
		len(errs), len(d.dirty.keys)+len(d.dirty.ips)+len(d.dirty.eps), errors.Join(firstErrors(errs, 3)...))
}

func firstErrors(errs []error, n int) []error {
	if len(errs) > n {
		return append(errs[:n:n], fmt.Errorf("and %d more", len(errs)-n))
	}
	return errs
}

// retryDone ends the backoff once neither the policy maps nor node
// isolation have writes left; callers hold mu.
func (d *Datapath) retryDone() {
	if d.dirty.empty() && !d.nodeIso.failed {
		d.retryDelay = 0
	}
}

// scheduleRetry flushes (and re-applies node isolation, if that failed)
// again later with exponential backoff; callers hold mu.
func (d *Datapath) scheduleRetry() {
	if d.retryTimer != nil || d.closed {
		return
	}
	delay := d.retryDelay
	if delay == 0 {
		delay = d.baseRetryDelay()
	}
	d.retryDelay = min(2*delay, maxRetryDelay)
	d.retryTimer = time.AfterFunc(delay, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.retryTimer = nil
		if d.closed {
			return
		}
		err := d.flush()
		if d.nodeIso.failed {
			// Its error also names invalid policies, which no retry mends.
			if nerr := d.applyNodeIsolation(); d.nodeIso.failed {
				err = errors.Join(err, nerr)
			}
		}
		if err != nil {
			// Once per episode: a full map is also logged by refused().
			if delay == d.baseRetryDelay() {
				d.log.Error("policy map update retry failed; retrying with backoff", zap.Error(err))
			} else {
				d.log.Debug("policy map update retry failed", zap.Error(err), zap.Duration("after", delay))
			}
		} else {
			d.log.Info("policy maps up to date after retry")
		}
	})
}

func (d *Datapath) baseRetryDelay() time.Duration {
	if d.cfg.retryDelay > 0 {
		return d.cfg.retryDelay
	}
	return defaultRetryDelay
}

func (d *Datapath) policyAdd(k policy.Key) write {
	return write{
		what: fmt.Sprintf("add policy entry %v (map holds %d)", k, len(d.mirror.policy)),
		m:    d.objs.CdoPolicy, insert: true,
		do: func() error {
			bk := policyKey(k)
			return d.objs.CdoPolicy.Update(&bk, &bpf.CoordinoPolicyValue{}, ebpf.UpdateAny)
		},
		done: func() { d.mirror.policy[k] = struct{}{}; delete(d.dirty.keys, k) },
	}
}

func (d *Datapath) policyDelete(k policy.Key) write {
	return write{
		what: fmt.Sprintf("delete policy entry %v", k),
		m:    d.objs.CdoPolicy,
		do: func() error {
			bk := policyKey(k)
			return deleteKey(d.objs.CdoPolicy, &bk)
		},
		done: func() { delete(d.mirror.policy, k); delete(d.dirty.keys, k) },
	}
}

// endpointWrite writes v; final says whether v is the wanted value (else a
// step towards it, and the entry stays pending).
func (d *Datapath) endpointWrite(ifindex uint32, v bpf.CoordinoEndpointInfo, final bool) write {
	return write{
		what: fmt.Sprintf("update endpoint ifindex %d", ifindex),
		m:    d.objs.CdoEndpoints, insert: true,
		do: func() error { return d.objs.CdoEndpoints.Update(&ifindex, &v, ebpf.UpdateAny) },
		done: func() {
			d.mirror.endpoints[ifindex] = v
			if final {
				delete(d.dirty.eps, ifindex)
			}
		},
	}
}

func (d *Datapath) endpointDelete(ifindex uint32) write {
	return write{
		what: fmt.Sprintf("delete endpoint ifindex %d", ifindex),
		m:    d.objs.CdoEndpoints,
		do:   func() error { return deleteKey(d.objs.CdoEndpoints, &ifindex) },
		done: func() { delete(d.mirror.endpoints, ifindex); delete(d.dirty.eps, ifindex) },
	}
}

func (d *Datapath) ipcacheWrite(p netip.Prefix, v bpf.CoordinoIpcacheValue) write {
	return write{
		what: fmt.Sprintf("update ipcache %s", p),
		m:    d.objs.CdoIpcache, insert: true,
		do: func() error {
			k := ipcacheKey(p)
			return d.objs.CdoIpcache.Update(&k, &v, ebpf.UpdateAny)
		},
		done: func() { d.mirror.ipcache[p] = v; delete(d.dirty.ips, p) },
	}
}

func (d *Datapath) ipcacheDelete(p netip.Prefix) write {
	return write{
		what: fmt.Sprintf("delete ipcache %s", p),
		m:    d.objs.CdoIpcache,
		do: func() error {
			k := ipcacheKey(p)
			return deleteKey(d.objs.CdoIpcache, &k)
		},
		done: func() { delete(d.mirror.ipcache, p); delete(d.dirty.ips, p) },
	}
}

// endpointPending reports whether anything of r is not in the maps yet.
func (d *Datapath) endpointPending(r *record) bool {
	if _, ok := d.dirty.eps[uint32(r.HostIfIndex)]; ok {
		return true
	}
	for _, ip := range r.IPs {
		if _, ok := d.dirty.ips[netip.PrefixFrom(ip, ip.BitLen())]; ok {
			return true
		}
	}
	for k := range d.dirty.keys {
		if k.Local == r.Identity {
			return true
		}
	}
	return false
}

// syncEndpointsOnly removes map entries of detached endpoints without
// recompiling; used before the first policy snapshot arrives.
func (d *Datapath) syncEndpointsOnly() error {
	if d.synced {
		return nil
	}
	live := map[uint32]bool{}
	addrs := map[netip.Prefix]bool{}
	for _, r := range d.eps {
		live[uint32(r.HostIfIndex)] = true
		for _, ip := range r.IPs {
			addrs[netip.PrefixFrom(ip, ip.BitLen())] = true
		}
	}
	for ifindex := range d.mirror.endpoints {
		if live[ifindex] {
			continue
		}
		if err := deleteKey(d.objs.CdoEndpoints, &ifindex); err != nil {
			return fmt.Errorf("delete endpoint ifindex %d: %w", ifindex, err)
		}
		delete(d.mirror.endpoints, ifindex)
	}
	for p, v := range d.mirror.ipcache {
		id := identity.ID(v.Identity)
		if addrs[p] || id.IsCIDR() || id == identity.Host || id == identity.RemoteNode {
			continue
		}
		k := ipcacheKey(p)
		if err := deleteKey(d.objs.CdoIpcache, &k); err != nil {
			return fmt.Errorf("delete ipcache %s: %w", p, err)
		}
		delete(d.mirror.ipcache, p)
	}
	return d.bumpRevision()
}

func (d *Datapath) bumpRevision() error {
	d.revision++
	if err := d.writeConfig(); err != nil {
		return fmt.Errorf("update policy revision: %w", err)
	}
	return nil
}

// writeConfig stores the revision and flags; callers hold mu, so neither
// write can undo the other.
func (d *Datapath) writeConfig() error {
	cfg := bpf.CoordinoConfig{PolicyRevision: d.revision, Flags: d.cfgFlags}
	return d.objs.CdoConfig.Update(uint32(0), &cfg, ebpf.UpdateAny)
}
