package nftdp

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// stats count the writer's transactions for metrics and status.
type stats struct {
	transactions, failures uint64
	// lastOps is the number of changes of the last transaction, and
	// lastChainAdds how many chains it created.
	lastOps, lastChainAdds int
	// batched counts the attaches the transactions carried.
	batched uint64
	// sweeps are the transactions that deleted doomed objects, swept how
	// many objects they deleted, sweepFailures the refused ones
	// (sweep_linux.go).
	sweeps, swept, sweepFailures uint64
}

// txn is one transaction in the making, in phases: element removals, new
// sets and chains (or doomed ones taken back), chain contents and element
// additions, the emptying of objects no longer referenced; and on success
// what the mirror learns, those objects doomed among it (sweep_linux.go).
type txn struct {
	pre, create, mid, last []func(c *nftables.Conn) error
	commit                 []func()
	ops                    int
	// chainAdds counts the chains the transaction creates.
	chainAdds int
	// creating are the identities whose maps this transaction makes.
	creating map[identity.ID]bool
}

func (t *txn) elems(s *nftables.Set, del bool, es []nftables.SetElement) {
	if len(es) == 0 {
		return
	}
	t.ops += len(es)
	if del {
		t.pre = append(t.pre, func(c *nftables.Conn) error { return c.SetDeleteElements(s, es) })
	} else {
		t.mid = append(t.mid, func(c *nftables.Conn) error { return c.SetAddElements(s, es) })
	}
}

// rewrite queues chain ch's content replaced by rules (a new chain is
// created first, createChain): in one transaction no packet sees it half
// written. A chain that exists is never added again: the kernel takes an
// update of an existing chain tens of milliseconds to commit, a new chain
// or a flush tens of microseconds.
func (t *txn) rewrite(ch *nftables.Chain, rules [][]expr.Any) {
	t.rewriteWith(ch, func(*nftables.Conn) ([][]expr.Any, error) { return rules, nil })
}

// rewriteWith is rewrite of rules that queue sets of their own on the
// transaction's connection first.
func (t *txn) rewriteWith(ch *nftables.Chain, rules func(c *nftables.Conn) ([][]expr.Any, error)) {
	t.ops++
	t.mid = append(t.mid, func(c *nftables.Conn) error {
		c.FlushChain(ch)
		rs, err := rules(c)
		if err != nil {
			return fmt.Errorf("chain %s: %w", ch.Name, err)
		}
		for _, e := range rs {
			c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: e})
		}
		return nil
	})
}

// flush writes what changed since the last flush in one transaction;
// callers hold mu, which it releases while the kernel commits (attaches
// book in meanwhile, commit_linux.go) and while it waits for a commit in
// flight to end. Before the first snapshot it writes nothing; that
// snapshot's flush compares everything (a restart's adopted table
// included). On failure the kernel keeps the previous state whole, and
// what was pending stays pending for the next flush, but for the attaches
// it carried, which are undone.
func (d *Datapath) flush() error {
	if !d.synced {
		return nil
	}
	// One transaction at a time, each built on what the last one left.
	for d.committing {
		d.settled.Wait()
	}
	d.collect()
	t := &txn{}
	d.writeEndpoints(t)
	d.writePairs(t)
	d.writeTiers(t)
	d.writeHost(t)
	d.writePods(t)
	d.writeCIDRs(t)
	d.writeLocals(t)
	d.writeNodeIso(t)
	batch := d.waiting
	d.waiting = nil
	defer d.settled.Broadcast()
	if t.ops == 0 {
		// Nothing to write; objects no longer wanted may still be doomed.
		for _, f := range t.commit {
			f()
		}
		d.dirty.reset()
		d.settle(batch, nil)
		d.scheduleSweep()
		return nil
	}
	c, err := d.build(t)
	if err != nil {
		d.settle(batch, err)
		return err
	}
	d.stats.transactions++
	d.stats.batched += uint64(len(batch))
	pending := d.dirty
	d.dirty.reset()
	if err = d.commitUnlocked(c, testBeforeCommit); err != nil {
		d.stats.failures++
		d.dirty.merge(pending)
		err = fmt.Errorf("nftables datapath: transaction of %d changes refused, previous policy kept: %w", t.ops, err)
		d.settle(batch, err)
		return err
	}
	for _, f := range t.commit {
		f()
	}
	d.stats.lastOps, d.stats.lastChainAdds = t.ops, t.chainAdds
	d.settle(batch, nil)
	d.scheduleSweep()
	return nil
}

// commitUnlocked sends c's transaction with mu released (attaches book
// into the next one meanwhile) and committing set (every other
// transaction waits); before, when set, runs just before the send.
// Callers hold mu.
func (d *Datapath) commitUnlocked(c *nftables.Conn, before func()) error {
	d.committing = true
	d.mu.Unlock()
	if before != nil {
		before()
	}
	err := c.Flush()
	d.mu.Lock()
	d.committing = false
	d.settled.Broadcast()
	return err
}

// build queues t on a connection of its own: a transaction that fails to
// build is dropped with it, nothing of it sent.
func (d *Datapath) build(t *txn) (*nftables.Conn, error) {
	c, err := d.newConn()
	if err != nil {
		return nil, err
	}
	for _, phase := range [][]func(*nftables.Conn) error{t.pre, t.create, t.mid, t.last} {
		for _, op := range phase {
			if err := op(c); err != nil {
				return nil, fmt.Errorf("nftables datapath: build transaction: %w", err)
			}
		}
	}
	d.failForTest(c)
	return c, nil
}

// failForTest makes c's transaction fail in the kernel when a test asks
// for it (testFailTransaction), with a deletion of an element that does
// not exist: the kernel refuses the whole batch, as any real failure.
func (d *Datapath) failForTest(c *nftables.Conn) {
	if testFailTransaction != nil && testFailTransaction() {
		_ = c.SetDeleteElements(d.lay.sets[setHost4], []nftables.SetElement{{Key: []byte{0, 0, 0, 0}}})
	}
}

// testFailTransaction, when set by a test, makes transactions fail in the
// kernel.
var testFailTransaction func() bool

// testBeforeCommit, when set by a test, runs before each kernel commit,
// without mu.
var testBeforeCommit func()

// collect turns what the engine touched into pending items. The first
// flush takes everything the engine wants and everything the table holds.
func (d *Datapath) collect() {
	ch := d.engine.TakeChanges()
	for _, err := range d.engine.TakeErrors() {
		d.log.Error("policy not fully applied", zap.Error(err))
	}
	defer func() { d.collectTiers(ch) }()
	if d.dirty.all {
		clear(d.groups)
		clear(d.byRemote)
		d.tiers.reset()
		d.engine.Keys(d.indexKey)
		for g := range d.groups {
			d.dirty.groups[g] = struct{}{}
		}
		for g := range d.inst.pairs {
			d.dirty.groups[g] = struct{}{}
		}
		d.dirty.cidr, d.dirty.host = true, true
		for a := range d.inst.pods {
			d.dirty.addrs[a] = struct{}{}
		}
		for a := range d.remote {
			d.dirty.addrs[a] = struct{}{}
		}
		for ifname := range d.inst.eps {
			d.dirty.ifnames[ifname] = struct{}{}
		}
		for _, r := range d.eps {
			d.markEndpoint(r)
		}
		for g := range d.groups {
			d.dirty.remotes[g.remote] = struct{}{}
		}
		return
	}
	for k := range ch.Keys {
		d.indexKey(k)
		if k.Dir&policy.DirBaseline != 0 {
			continue // a tier key alone
		}
		g := group{local: k.Local, remote: k.Remote, dir: k.Dir}
		d.dirty.groups[g] = struct{}{}
		if g.remote.IsCIDR() {
			d.dirty.cidr = true
		} else if g.remote != identity.Any {
			d.dirty.remotes[g.remote] = struct{}{}
		}
	}
	if len(ch.Prefixes) > 0 {
		d.dirty.cidr = true
	}
	for id := range ch.Isolation {
		for _, r := range d.eps {
			if r.Identity == id {
				d.dirty.ifnames[r.HostIfName] = struct{}{}
			}
		}
	}
}

// indexKey files or unfiles key k as the engine wants it now: its
// NetworkPolicy allow by group and remote, its tier rule in the tier
// index (queueing its unit).
func (d *Datapath) indexKey(k policy.Key) {
	rule, tiered := d.engine.KeyTier(k)
	if d.tiers.file(k, rule, tiered) {
		d.dirty.units[tierUnit{local: k.Local, dir: k.Dir}] = struct{}{}
	}
	g := group{local: k.Local, remote: k.Remote, dir: k.Dir}
	if d.engine.AllowsKey(k) {
		if d.groups[g] == nil {
			d.groups[g] = map[policy.Key]struct{}{}
			if d.byRemote[g.remote] == nil {
				d.byRemote[g.remote] = map[group]struct{}{}
			}
			d.byRemote[g.remote][g] = struct{}{}
		}
		d.groups[g][k] = struct{}{}
		return
	}
	if keys := d.groups[g]; keys != nil {
		delete(keys, k)
		if len(keys) == 0 {
			delete(d.groups, g)
			delete(d.byRemote[g.remote], g)
			if len(d.byRemote[g.remote]) == 0 {
				delete(d.byRemote, g.remote)
			}
		}
	}
}

// localOwners maps the endpoints' addresses to their identities.
func (d *Datapath) localOwners() map[netip.Addr]identity.ID {
	local := map[netip.Addr]identity.ID{}
	for _, r := range d.eps {
		for _, ip := range r.IPs {
			local[ip] = r.Identity
		}
	}
	return local
}

// owner is the identity a peer address resolves to: a local endpoint's,
// the host's, or a remote pod's, in that order (as in eBPF mode).
func (d *Datapath) owner(a netip.Addr, local map[netip.Addr]identity.ID) (identity.ID, bool) {
	if id, ok := local[a]; ok {
		return id, true
	}
	if slices.Contains(d.nodeIPs, a) {
		return identity.Host, true
	}
	id, ok := d.remote[a]
	return id, ok
}

// localDir is one local identity's direction: a pods or cidrs map.
type localDir struct {
	local identity.ID
	dir   policy.Direction
}

// writePods brings the pods maps in line for every pending address: the
// address jumps, in each local identity's map that has a pair with its
// owner, to that pair's chain.
func (d *Datapath) writePods(t *txn) {
	local := d.localOwners()
	if len(d.dirty.remotes) > 0 {
		// Pairs with these identities came or went: all their addresses.
		mark := func(a netip.Addr, id identity.ID) {
			if _, ok := d.dirty.remotes[id]; ok {
				d.dirty.addrs[a] = struct{}{}
			}
		}
		for a, id := range local {
			mark(a, id)
		}
		for _, a := range d.nodeIPs {
			mark(a, identity.Host)
		}
		for a, id := range d.remote {
			mark(a, id)
		}
	}
	for a := range d.dirty.addrs {
		want := map[localDir]string{}
		if id, ok := d.owner(a, local); ok {
			for g := range d.byRemote[id] {
				want[localDir{g.local, g.dir}] = pairChain(g)
			}
		}
		have := d.inst.pods[a]
		if maps.Equal(want, have) {
			continue
		}
		key := a.AsSlice()
		for ld, chain := range have {
			if want[ld] != chain {
				t.elems(d.podsSetOf(ld, a), true, []nftables.SetElement{{Key: key}})
			}
		}
		for ld, chain := range want {
			if have[ld] != chain {
				d.needLocal(t, ld.local)
				t.elems(d.podsSetOf(ld, a), false, []nftables.SetElement{{Key: key,
					VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}})
			}
		}
		t.commit = append(t.commit, func() {
			if len(want) == 0 {
				delete(d.inst.pods, a)
			} else {
				d.inst.pods[a] = want
			}
		})
	}
}

func (d *Datapath) podsSetOf(ld localDir, a netip.Addr) *nftables.Set {
	return &nftables.Set{Table: d.lay.table, Name: podsSet(ld.local, ld.dir, a.Is6()), IsMap: true}
}

// cidrElem is one element of a cidrs map.
type cidrElem struct {
	localDir
	r addrRange
}

func (e cidrElem) key() (start, end []byte) {
	return append(e.r.lo.AsSlice(), 0, 0, 0, 0), append(e.r.hi.AsSlice(), 255, 0, 0, 0)
}

// writeCIDRs brings the cidrs maps in line after a change of the prefixes
// in use or of a pair with a CIDR identity: each range of a CIDR identity
// jumps, in each local identity's map with a pair with it, to that pair's
// chain. Prefixes are few (ipBlocks), so it compares them all.
func (d *Datapath) writeCIDRs(t *txn) {
	if !d.dirty.cidr {
		return
	}
	prefixes := map[netip.Prefix]identity.ID{}
	d.engine.Prefixes(func(p netip.Prefix, id identity.ID) { prefixes[p] = id })
	rangesOf := map[identity.ID][]addrRange{}
	for r, id := range cidrRanges(prefixes) {
		rangesOf[id] = append(rangesOf[id], r)
	}
	want := map[cidrElem]string{}
	for id, groups := range d.byRemote {
		if !id.IsCIDR() {
			continue
		}
		for g := range groups {
			for _, r := range rangesOf[id] {
				want[cidrElem{localDir{g.local, g.dir}, r}] = pairChain(g)
			}
		}
	}
	set := func(e cidrElem) *nftables.Set {
		return &nftables.Set{Table: d.lay.table, Name: cidrsSet(e.local, e.dir, e.r.lo.Is6()), IsMap: true,
			Interval: true, Concatenation: true}
	}
	for e, chain := range d.inst.cidrs {
		if want[e] != chain {
			lo, hi := e.key()
			t.elems(set(e), true, []nftables.SetElement{{Key: lo, KeyEnd: hi}})
		}
	}
	for e, chain := range want {
		if d.inst.cidrs[e] != chain {
			d.needLocal(t, e.local)
			lo, hi := e.key()
			t.elems(set(e), false, []nftables.SetElement{{Key: lo, KeyEnd: hi,
				VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}})
		}
	}
	t.commit = append(t.commit, func() { d.inst.cidrs = want })
}

// writeHost brings the host sets (this node's addresses that no endpoint
// holds) in line.
func (d *Datapath) writeHost(t *txn) {
	if !d.dirty.host && len(d.dirty.addrs) == 0 {
		return
	}
	local := d.localOwners()
	want := map[netip.Addr]struct{}{}
	for _, a := range d.nodeIPs {
		if _, ok := local[a]; !ok {
			want[a] = struct{}{}
		}
	}
	set := func(a netip.Addr) *nftables.Set {
		if a.Is4() {
			return d.lay.sets[setHost4]
		}
		return d.lay.sets[setHost6]
	}
	changed := false
	for a := range d.inst.host {
		if _, ok := want[a]; !ok {
			t.elems(set(a), true, []nftables.SetElement{{Key: a.AsSlice()}})
			changed = true
		}
	}
	for a := range want {
		if _, ok := d.inst.host[a]; !ok {
			t.elems(set(a), false, []nftables.SetElement{{Key: a.AsSlice()}})
			changed = true
		}
	}
	if changed {
		t.commit = append(t.commit, func() { d.inst.host = want })
	}
}

// writePairs brings each pending identity pair's chain in line with the
// engine's keys. The chain of "any remote" lives as long as its local
// identity (endpoint chains jump to it); the others as long as they allow
// something.
func (d *Datapath) writePairs(t *txn) {
	for g := range d.dirty.groups {
		var want []allowElem
		if keys := d.groups[g]; len(keys) > 0 {
			want = groupElems(g, slices.Collect(maps.Keys(keys)))
		}
		have, had := d.inst.pairs[g]
		ch := &nftables.Chain{Table: d.lay.table, Name: pairChain(g)}
		if len(want) == 0 && g.remote != identity.Any {
			if had {
				// The elements that jumped here go in this transaction
				// (writePods, writeCIDRs).
				d.doomChain(t, ch)
				t.commit = append(t.commit, func() { delete(d.inst.pairs, g) })
			}
			continue
		}
		if had && have.known && slices.Equal(have.elems, want) {
			continue
		}
		if len(want) == 0 && !d.inst.locals[g.local] {
			continue // goes with its identity
		}
		d.needLocal(t, g.local)
		// The "any remote" chain exists with its identity (needLocal).
		if !had && g.remote != identity.Any {
			d.createChain(t, ch)
		}
		t.rewriteWith(ch, func(c *nftables.Conn) ([][]expr.Any, error) {
			return pairRules(c, d.lay.table, want)
		})
		t.commit = append(t.commit, func() { d.inst.pairs[g] = pairState{elems: want, known: true} })
	}
}

// needLocal makes sure local's maps and "any remote" chains exist by the
// time the transaction's rules and elements name them.
func (d *Datapath) needLocal(t *txn, local identity.ID) {
	if d.inst.locals[local] || t.creating[local] {
		return
	}
	if t.creating == nil {
		t.creating = map[identity.ID]bool{}
	}
	t.creating[local] = true
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		for _, s := range localSets(d.lay.table, local, dir) {
			d.createSet(t, s)
		}
		d.createChain(t, &nftables.Chain{Table: d.lay.table, Name: pairChain(group{local: local, remote: identity.Any, dir: dir})})
	}
	t.ops++
	t.commit = append(t.commit, func() { d.inst.locals[local] = true })
}

// writeLocals dooms the maps and "any remote" chains of identities that no
// endpoint holds and no pair names: no endpoint chain looks them up any
// more, and their elements went with their pairs.
func (d *Datapath) writeLocals(t *txn) {
	used := map[identity.ID]bool{}
	for _, r := range d.eps {
		used[r.Identity] = true
	}
	for g := range d.groups {
		used[g.local] = true
	}
	for local := range d.inst.locals {
		if used[local] || t.creating[local] {
			continue
		}
		for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
			g := group{local: local, remote: identity.Any, dir: dir}
			d.doomChain(t, &nftables.Chain{Table: d.lay.table, Name: pairChain(g)})
			for _, s := range localSets(d.lay.table, local, dir) {
				d.doomSet(t, s)
			}
			t.commit = append(t.commit, func() { delete(d.inst.pairs, g) })
		}
		t.commit = append(t.commit, func() { delete(d.inst.locals, local) })
	}
}

// writeEndpoints brings each pending interface's chains, verdict map
// elements and source addresses in line with its endpoint (or, the
// endpoint gone, removes the elements and dooms the chains they reached).
func (d *Datapath) writeEndpoints(t *txn) {
	if len(d.dirty.ifnames) == 0 {
		return
	}
	byIf := map[string]*record{}
	for _, r := range d.eps {
		byIf[r.HostIfName] = r
	}
	srcByIf := map[string][]srcElem{}
	for e := range d.inst.src {
		srcByIf[e.ifname] = append(srcByIf[e.ifname], e)
	}
	dirs := []policy.Direction{policy.Ingress, policy.Egress}
	for ifname := range d.dirty.ifnames {
		r := byIf[ifname]
		d.writeSources(t, ifname, r, srcByIf[ifname])
		have, had := d.inst.eps[ifname]
		key := []nftables.SetElement{{Key: ifnameBytes(ifname)}}
		if r == nil {
			if !had {
				continue
			}
			t.elems(d.lay.sets[setPodIfs], true, key)
			for _, dir := range dirs {
				ch := &nftables.Chain{Table: d.lay.table, Name: endpointChain(ifname, dir)}
				t.elems(d.lay.sets[epsSet(dir)], true, key)
				d.doomChain(t, ch)
			}
			t.commit = append(t.commit, func() { delete(d.inst.eps, ifname) })
			continue
		}
		if r.dying {
			if had && !have.dead {
				// A drop before the rules: an insertion deletes nothing.
				for _, dir := range dirs {
					ch := &nftables.Chain{Table: d.lay.table, Name: endpointChain(ifname, dir)}
					t.ops++
					t.mid = append(t.mid, func(c *nftables.Conn) error {
						c.InsertRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: []expr.Any{verdict(expr.VerdictDrop)}})
						return nil
					})
				}
				t.commit = append(t.commit, func() { d.inst.eps[ifname] = epState{id: have.id, iso: have.iso, dead: true} })
			}
			continue
		}
		want := epState{id: r.Identity, iso: d.engine.Isolation(r.Identity)}
		if had && have == want {
			continue
		}
		if want.iso.Has(policy.Ingress) || want.iso.Has(policy.Egress) {
			// Only an isolated direction's rules look the peer up in the
			// identity's maps: a pod no policy selects costs no sets.
			d.needLocal(t, want.id)
		}
		if !had {
			t.elems(d.lay.sets[setPodIfs], false, key)
		}
		for _, dir := range dirs {
			ch := &nftables.Chain{Table: d.lay.table, Name: endpointChain(ifname, dir)}
			if !had {
				d.createChain(t, ch)
			}
			t.rewrite(ch, endpointRules(dir, want.id, want.iso))
			if !had {
				t.elems(d.lay.sets[epsSet(dir)], false, []nftables.SetElement{{Key: ifnameBytes(ifname),
					VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}}})
			}
		}
		t.commit = append(t.commit, func() { d.inst.eps[ifname] = want })
	}
}

// writeSources brings the addresses ifname may send from in line with r.
func (d *Datapath) writeSources(t *txn, ifname string, r *record, have []srcElem) {
	want := map[srcElem]struct{}{}
	if r != nil {
		for _, ip := range r.IPs {
			want[srcElem{ifname: ifname, addr: ip}] = struct{}{}
		}
	}
	for _, e := range have {
		if _, ok := want[e]; !ok {
			t.elems(d.srcSet(e.addr), true, []nftables.SetElement{{Key: e.key()}})
			t.commit = append(t.commit, func() { delete(d.inst.src, e) })
		}
	}
	for e := range want {
		if _, ok := d.inst.src[e]; !ok {
			t.elems(d.srcSet(e.addr), false, []nftables.SetElement{{Key: e.key()}})
			t.commit = append(t.commit, func() { d.inst.src[e] = struct{}{} })
		}
	}
}

func (d *Datapath) srcSet(a netip.Addr) *nftables.Set {
	if a.Is4() {
		return d.lay.sets[setSrc4]
	}
	return d.lay.sets[setSrc6]
}

func (e srcElem) key() []byte { return append(ifnameBytes(e.ifname), e.addr.AsSlice()...) }
