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
	// lastOps is the number of operations of the last transaction.
	lastOps int
}

// txn is one transaction in the making: element removals first, then
// chains and element additions, then chain removals (a chain goes once no
// verdict map element jumps to it), and on success what the mirror learns.
type txn struct {
	pre, mid, post []func(c *nftables.Conn) error
	commit         []func()
	ops            int
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

// flush writes what changed since the last flush in one transaction;
// callers hold mu. Before the first snapshot it writes nothing; that
// snapshot's flush compares everything (a restart's adopted table
// included). On failure the kernel keeps the previous state whole, and
// what was pending stays pending for the next flush.
func (d *Datapath) flush() error {
	if !d.synced {
		return nil
	}
	d.collect()
	t := &txn{}
	d.writeEndpoints(t)
	d.writeIpcache(t)
	d.writeCIDRs(t)
	d.writeAllow(t)
	if t.ops == 0 {
		d.dirty.reset()
		return nil
	}
	for _, phase := range [][]func(*nftables.Conn) error{t.pre, t.mid, t.post} {
		for _, op := range phase {
			if err := op(d.conn); err != nil {
				_ = d.conn.Flush() // discards the queued messages
				return fmt.Errorf("nftables datapath: build transaction: %w", err)
			}
		}
	}
	if testFailTransaction != nil && testFailTransaction() {
		// A deletion of an element that does not exist: the kernel refuses
		// the whole batch, as any real failure would.
		_ = d.conn.SetDeleteElements(d.lay.sets[setIpcache4], []nftables.SetElement{{Key: []byte{0, 0, 0, 0}}})
	}
	d.stats.transactions++
	if err := d.conn.Flush(); err != nil {
		d.stats.failures++
		return fmt.Errorf("nftables datapath: transaction of %d changes: %w", t.ops, err)
	}
	for _, f := range t.commit {
		f()
	}
	d.stats.lastOps = t.ops
	d.dirty.reset()
	return nil
}

// testFailTransaction, when set by a test, makes a transaction fail in
// the kernel.
var testFailTransaction func() bool

// collect turns what the engine touched into pending items. The first
// flush takes everything the engine wants and everything the table holds.
func (d *Datapath) collect() {
	ch := d.engine.TakeChanges()
	for _, err := range d.engine.TakeErrors() {
		d.log.Error("policy not fully applied", zap.Error(err))
	}
	if d.dirty.all {
		clear(d.groups)
		d.engine.Keys(func(k policy.Key) { d.indexKey(k, true) })
		for g := range d.groups {
			d.dirty.groups[g] = struct{}{}
		}
		for g := range d.inst.allow {
			d.dirty.groups[g] = struct{}{}
		}
		d.dirty.cidr = true
		for a := range d.inst.ipcache {
			d.dirty.addrs[a] = struct{}{}
		}
		for _, ip := range d.nodeIPs {
			d.dirty.addrs[ip] = struct{}{}
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
		return
	}
	for k := range ch.Keys {
		d.indexKey(k, d.engine.WantsKey(k))
		d.dirty.groups[group{local: k.Local, remote: k.Remote, dir: k.Dir}] = struct{}{}
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

func (d *Datapath) indexKey(k policy.Key, want bool) {
	g := group{local: k.Local, remote: k.Remote, dir: k.Dir}
	if want {
		if d.groups[g] == nil {
			d.groups[g] = map[policy.Key]struct{}{}
		}
		d.groups[g][k] = struct{}{}
		return
	}
	delete(d.groups[g], k)
	if len(d.groups[g]) == 0 {
		delete(d.groups, g)
	}
}

// owner is the identity the ipcache gives a: a local endpoint's, the
// host's, or a remote pod's, in that order (as in eBPF mode).
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

func (d *Datapath) ipcacheSet(a netip.Addr) *nftables.Set {
	if a.Is4() {
		return d.lay.sets[setIpcache4]
	}
	return d.lay.sets[setIpcache6]
}

func (d *Datapath) writeIpcache(t *txn) {
	if len(d.dirty.addrs) == 0 {
		return
	}
	local := map[netip.Addr]identity.ID{}
	for _, r := range d.eps {
		for _, ip := range r.IPs {
			local[ip] = r.Identity
		}
	}
	for a := range d.dirty.addrs {
		want, ok := d.owner(a, local)
		have, had := d.inst.ipcache[a]
		if ok == had && want == have {
			continue
		}
		s := d.ipcacheSet(a)
		if had {
			t.elems(s, true, []nftables.SetElement{{Key: a.AsSlice()}})
		}
		if ok {
			t.elems(s, false, []nftables.SetElement{{Key: a.AsSlice(), Val: idBytes(want)}})
		}
		t.commit = append(t.commit, func() {
			if ok {
				d.inst.ipcache[a] = want
			} else {
				delete(d.inst.ipcache, a)
			}
		})
	}
}

func (d *Datapath) writeCIDRs(t *txn) {
	if !d.dirty.cidr {
		return
	}
	prefixes := map[netip.Prefix]identity.ID{}
	d.engine.Prefixes(func(p netip.Prefix, id identity.ID) { prefixes[p] = id })
	want := cidrRanges(prefixes)
	set := func(r addrRange) *nftables.Set {
		if r.lo.Is4() {
			return d.lay.sets[setCIDR4]
		}
		return d.lay.sets[setCIDR6]
	}
	for r, id := range d.inst.cidr {
		if w, ok := want[r]; !ok || w != id {
			lo, hi := r.keys()
			t.elems(set(r), true, []nftables.SetElement{{Key: lo, KeyEnd: hi}})
		}
	}
	for r, id := range want {
		if have, ok := d.inst.cidr[r]; !ok || have != id {
			lo, hi := r.keys()
			t.elems(set(r), false, []nftables.SetElement{{Key: lo, KeyEnd: hi, Val: idBytes(id)}})
		}
	}
	t.commit = append(t.commit, func() { d.inst.cidr = want })
}

func (d *Datapath) writeAllow(t *txn) {
	for g := range d.dirty.groups {
		want := map[allowElem]struct{}{}
		if keys := d.groups[g]; len(keys) > 0 {
			for _, e := range groupElems(g, slices.Collect(maps.Keys(keys))) {
				want[e] = struct{}{}
			}
		}
		have := d.inst.allow[g]
		s := d.lay.sets[allowSet(g.dir)]
		var del, add []nftables.SetElement
		for e := range have {
			if _, ok := want[e]; !ok {
				lo, hi := e.keys()
				del = append(del, nftables.SetElement{Key: lo, KeyEnd: hi})
			}
		}
		for e := range want {
			if _, ok := have[e]; !ok {
				lo, hi := e.keys()
				add = append(add, nftables.SetElement{Key: lo, KeyEnd: hi})
			}
		}
		if len(del)+len(add) == 0 {
			continue
		}
		t.elems(s, true, del)
		t.elems(s, false, add)
		t.commit = append(t.commit, func() {
			if len(want) == 0 {
				delete(d.inst.allow, g)
			} else {
				d.inst.allow[g] = want
			}
		})
	}
}

// writeEndpoints brings each pending interface's chains, verdict map
// elements and source addresses in line with its endpoint (or removes
// them, the endpoint gone).
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
	for ifname := range d.dirty.ifnames {
		r := byIf[ifname]
		have, had := d.inst.eps[ifname]
		// Source addresses.
		wantSrc := map[srcElem]struct{}{}
		if r != nil {
			for _, ip := range r.IPs {
				wantSrc[srcElem{ifname: ifname, addr: ip}] = struct{}{}
			}
		}
		for _, e := range srcByIf[ifname] {
			if _, ok := wantSrc[e]; !ok {
				t.elems(d.srcSet(e.addr), true, []nftables.SetElement{{Key: e.key()}})
				t.commit = append(t.commit, func() { delete(d.inst.src, e) })
			}
		}
		for e := range wantSrc {
			if _, ok := d.inst.src[e]; !ok {
				t.elems(d.srcSet(e.addr), false, []nftables.SetElement{{Key: e.key()}})
				t.commit = append(t.commit, func() { d.inst.src[e] = struct{}{} })
			}
		}
		// Chains and verdict map elements.
		key := []nftables.SetElement{{Key: ifnameBytes(ifname)}}
		dirs := []policy.Direction{policy.Ingress, policy.Egress}
		if r == nil {
			if !had {
				continue
			}
			for _, dir := range dirs {
				ch := &nftables.Chain{Table: d.lay.table, Name: endpointChain(ifname, dir)}
				t.elems(d.lay.sets[epsSet(dir)], true, key)
				t.post = append(t.post, func(c *nftables.Conn) error { c.FlushChain(ch); c.DelChain(ch); return nil })
			}
			t.ops++
			t.commit = append(t.commit, func() { delete(d.inst.eps, ifname) })
			continue
		}
		want := epState{id: r.Identity, iso: d.engine.Isolation(r.Identity)}
		if had && have == want {
			continue
		}
		for _, dir := range dirs {
			ch := &nftables.Chain{Table: d.lay.table, Name: endpointChain(ifname, dir)}
			rules := endpointRules(dir, want.id, want.iso)
			// Replaced whole in this transaction: no packet sees it empty.
			t.mid = append(t.mid, func(c *nftables.Conn) error {
				c.AddChain(ch)
				c.FlushChain(ch)
				for _, e := range rules {
					c.AddRule(&nftables.Rule{Table: d.lay.table, Chain: ch, Exprs: e})
				}
				return nil
			})
			t.ops++
			if !had {
				el := []nftables.SetElement{{Key: ifnameBytes(ifname),
					VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}}}
				t.elems(d.lay.sets[epsSet(dir)], false, el)
			}
		}
		t.commit = append(t.commit, func() { d.inst.eps[ifname] = want })
	}
}

func (d *Datapath) srcSet(a netip.Addr) *nftables.Set {
	if a.Is4() {
		return d.lay.sets[setSrc4]
	}
	return d.lay.sets[setSrc6]
}

func (e srcElem) key() []byte { return append(ifnameBytes(e.ifname), e.addr.AsSlice()...) }
