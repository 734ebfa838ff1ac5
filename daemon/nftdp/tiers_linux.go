package nftdp

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// The ClusterNetworkPolicy tiers. A flow's tier verdict is the first, in
// rank order, of the tier rules matching its remote identity, the CIDR
// identity of its remote address or any remote (policy.Decide), so the
// three cannot be asked one after the other as NetworkPolicy's allows are.
// Each local identity's tier in one direction (a tier unit) has instead a
// chain per class of remote address, holding the rules of all three in
// rank order:
//
//   - class (R, C) for an address of identity R with tier rules, C its
//     CIDR identity when that has tier rules too (else none);
//   - class (-, C) for the other addresses in C's ranges;
//   - class (-, -) for every other address: the any-remote rules.
//
// The unit's dispatch chain sends the packet there through two verdict
// maps (the addresses of the first class, the ranges of the second) and
// a goto: Accept accepts, Deny counts and drops, and Pass or no match
// return to the endpoint chain, which goes on to NetworkPolicy (Admin) or
// to the default allow (Baseline). Changes are element and chain
// differences, in the policy delta's transaction.

// tierUnit is one local identity's tier in one direction: dir is the
// engine's key direction, with policy.DirBaseline for the Baseline tier.
type tierUnit struct {
	local identity.ID
	dir   policy.Direction
}

func (u tierUnit) flowDir() policy.Direction { return u.dir &^ policy.DirBaseline }

func (u tierUnit) letter() string {
	if u.dir&policy.DirBaseline != 0 {
		return "b"
	}
	return "a"
}

func (u tierUnit) denyReason() string {
	if u.dir&policy.DirBaseline != 0 {
		return reasonBaselineDeny
	}
	return reasonAdminDeny
}

// classKey is a class of remote addresses of a unit: an identity with tier
// rules and a CIDR identity with tier rules, either none (Any, 0).
type classKey struct{ remote, cidr identity.ID }

func tierPodsSet(u tierUnit, v6 bool) string {
	return fmt.Sprintf("%spods%s-%d-%s", u.letter(), famSuffix(v6), u.local, dirName(u.flowDir()))
}

func tierCIDRsSet(u tierUnit, v6 bool) string {
	return fmt.Sprintf("%scidrs%s-%d-%s", u.letter(), famSuffix(v6), u.local, dirName(u.flowDir()))
}

func dispatchChain(u tierUnit) string {
	return fmt.Sprintf("t%s-%d-%s", u.letter(), u.local, dirName(u.flowDir()))
}

func classChain(u tierUnit, c classKey) string {
	return fmt.Sprintf("c%s-%d-%d-%d-%s", u.letter(), u.local, c.remote, c.cidr, dirName(u.flowDir()))
}

func unitOf(letter string, local uint32, dir string) (tierUnit, bool) {
	u := tierUnit{local: identity.ID(local), dir: policy.Ingress}
	switch {
	case dir == "out":
		u.dir = policy.Egress
	case dir != "in":
		return u, false
	}
	switch letter {
	case "b":
		u.dir |= policy.DirBaseline
	case "a":
	default:
		return u, false
	}
	return u, true
}

// parseClassChain reads back classChain's names (adoption at start).
func parseClassChain(name string) (tierUnit, classKey, bool) {
	var letter, dir string
	var local, remote, cidr uint32
	if len(name) < 2 || name[0] != 'c' {
		return tierUnit{}, classKey{}, false
	}
	letter = name[1:2]
	if n, err := fmt.Sscanf(name[2:], "-%d-%d-%d-%s", &local, &remote, &cidr, &dir); err != nil || n != 4 {
		return tierUnit{}, classKey{}, false
	}
	u, ok := unitOf(letter, local, dir)
	c := classKey{remote: identity.ID(remote), cidr: identity.ID(cidr)}
	return u, c, ok && classChain(u, c) == name
}

// parseTierSet reads back the names of a unit's verdict maps.
func parseTierSet(name string) (u tierUnit, v6, cidr, ok bool) {
	for _, kind := range []string{"pods4", "pods6", "cidrs4", "cidrs6"} {
		for _, letter := range []string{"a", "b"} {
			var local uint32
			var dir string
			prefix := letter + kind + "-"
			if len(name) <= len(prefix) || name[:len(prefix)] != prefix {
				continue
			}
			if n, err := fmt.Sscanf(name[len(prefix):], "%d-%s", &local, &dir); err != nil || n != 2 {
				return u, false, false, false
			}
			u, ok = unitOf(letter, local, dir)
			v6, cidr = kind[len(kind)-1] == '6', kind[0] == 'c'
			if !ok || (cidr && tierCIDRsSet(u, v6) != name) || (!cidr && tierPodsSet(u, v6) != name) {
				return u, false, false, false
			}
			return u, v6, cidr, true
		}
	}
	return u, false, false, false
}

func tierSets(t *nftables.Table, u tierUnit) []*nftables.Set {
	return verdictMaps(t, func(v6 bool) string { return tierPodsSet(u, v6) }, func(v6 bool) string { return tierCIDRsSet(u, v6) })
}

// jumpTier is the endpoint chain's rule that asks unit u.
func jumpTier(u tierUnit) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: dispatchChain(u)}}
}

// dispatchRules send the packet to the chain of its peer's class.
func dispatchRules(u tierUnit) [][]expr.Any {
	dir := u.flowDir()
	var out [][]expr.Any
	for _, f := range families {
		out = append(out, append(f.match(), f.loadPeer(dir, 1),
			&expr.Lookup{SourceRegister: 1, SetName: tierPodsSet(u, f.v6), DestRegister: 0, IsDestRegSet: true}))
	}
	for _, f := range families {
		out = append(out, append(f.match(), f.loadPeer(dir, regConcat),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regConcat + f.addrLen/4},
			&expr.Lookup{SourceRegister: regConcat, SetName: tierCIDRsSet(u, f.v6), DestRegister: 0, IsDestRegSet: true}))
	}
	return append(out, []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: classChain(u, classKey{})}})
}

// tierElem is one tier rule of a class chain: what it matches and decides.
type tierElem struct {
	allowElem
	rule policy.TierRule
}

// classRules is the content of a class chain: its rules in rank order. A
// Deny is reported to the flow log with its tier's reason before it
// drops, as the endpoint chains' drops are.
func classRules(u tierUnit, elems []tierElem) [][]expr.Any {
	var out [][]expr.Any
	for _, el := range elems {
		e, ok := elemMatch(el.allowElem)
		if !ok {
			continue
		}
		switch el.rule.Action {
		case policyir.ActionAccept:
			out = append(out, append(e, verdict(expr.VerdictAccept)))
		case policyir.ActionDeny:
			pfx := logPrefix{dir: u.flowDir(), reason: u.denyReason(), local: u.local}
			out = append(out, dropRules(e, pfx, dropCounter(u.flowDir(), u.denyReason()))...)
		default: // Pass: on to the next stage
			out = append(out, append(e, verdict(expr.VerdictReturn)))
		}
	}
	return out
}

// unitState is what the table holds for a unit.
type unitState struct {
	pods    map[netip.Addr]classKey
	cidrs   map[addrRange]identity.ID
	classes map[classKey]classState
	// known is false for a unit adopted at start: its dispatch chain is
	// rewritten.
	known bool
}

// classState is a class chain's content; unknown for an adopted chain.
type classState struct {
	elems []tierElem
	known bool
}

func newUnitState() *unitState {
	return &unitState{pods: map[netip.Addr]classKey{}, cidrs: map[addrRange]identity.ID{}, classes: map[classKey]classState{}}
}

// tierIndex files the engine's keys that carry tier rules by group, the
// remotes of each unit and the units of each remote.
type tierIndex struct {
	groups   map[group]map[policy.Key]policy.TierRule
	remotes  map[tierUnit]map[identity.ID]int // groups per remote
	byRemote map[identity.ID]map[tierUnit]struct{}
}

func newTierIndex() tierIndex {
	return tierIndex{groups: map[group]map[policy.Key]policy.TierRule{}, remotes: map[tierUnit]map[identity.ID]int{},
		byRemote: map[identity.ID]map[tierUnit]struct{}{}}
}

func (x *tierIndex) reset() {
	clear(x.groups)
	clear(x.remotes)
	clear(x.byRemote)
}

// file records key k's tier rule (ok) or its absence; it reports whether
// the key had or has one.
func (x *tierIndex) file(k policy.Key, rule policy.TierRule, ok bool) bool {
	g := group{local: k.Local, remote: k.Remote, dir: k.Dir}
	u := tierUnit{local: k.Local, dir: k.Dir}
	keys := x.groups[g]
	_, had := keys[k]
	switch {
	case ok && keys == nil:
		keys = map[policy.Key]policy.TierRule{}
		x.groups[g] = keys
		if x.remotes[u] == nil {
			x.remotes[u] = map[identity.ID]int{}
		}
		x.remotes[u][g.remote]++
		if x.byRemote[g.remote] == nil {
			x.byRemote[g.remote] = map[tierUnit]struct{}{}
		}
		x.byRemote[g.remote][u] = struct{}{}
		fallthrough
	case ok:
		keys[k] = rule
	case had:
		delete(keys, k)
		if len(keys) > 0 {
			break
		}
		delete(x.groups, g)
		if x.remotes[u][g.remote]--; x.remotes[u][g.remote] == 0 {
			delete(x.remotes[u], g.remote)
			delete(x.byRemote[g.remote], u)
			if len(x.byRemote[g.remote]) == 0 {
				delete(x.byRemote, g.remote)
			}
		}
		if len(x.remotes[u]) == 0 {
			delete(x.remotes, u)
		}
	}
	return ok || had
}

// elems are the tier rules of the groups of u with the given remotes, in
// rank order, without repeats.
func (x *tierIndex) elems(u tierUnit, remotes ...identity.ID) []tierElem {
	var out []tierElem
	for _, r := range remotes {
		g := group{local: u.local, remote: r, dir: u.dir}
		for k, rule := range x.groups[g] {
			el := keyElem(group{local: u.local, dir: u.dir}, k)
			out = append(out, tierElem{allowElem: el, rule: rule})
		}
	}
	slices.SortFunc(out, func(a, b tierElem) int {
		switch {
		case a.rule.Before(b.rule):
			return -1
		case b.rule.Before(a.rule):
			return 1
		}
		return cmp.Or(cmp.Compare(a.protoLo, b.protoLo), cmp.Compare(a.protoHi, b.protoHi),
			cmp.Compare(a.portLo, b.portLo), cmp.Compare(a.portHi, b.portHi))
	})
	return slices.Compact(out)
}

// markUnits queues the four units of local.
func (d *Datapath) markUnits(local identity.ID) {
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		d.dirty.units[tierUnit{local: local, dir: dir}] = struct{}{}
		d.dirty.units[tierUnit{local: local, dir: dir | policy.DirBaseline}] = struct{}{}
	}
}

// wantUnit is what unit u should hold, nil when it should not exist: no
// endpoint chain asks it and it has no rules.
func (d *Datapath) wantUnit(u tierUnit, addrsOf map[identity.ID][]netip.Addr, rangesOf func() map[identity.ID][]addrRange) *unitState {
	remotes := d.tiers.remotes[u]
	if len(remotes) == 0 && !d.engine.Isolation(u.local).Tiered(u.flowDir()) {
		return nil
	}
	s := newUnitState()
	s.known = true
	class := func(c classKey) {
		if _, ok := s.classes[c]; !ok {
			s.classes[c] = classState{elems: d.tiers.elems(u, c.remote, c.cidr, identity.Any), known: true}
		}
	}
	class(classKey{})
	for r := range remotes {
		switch {
		case r == identity.Any:
		case r.IsCIDR():
			for _, rg := range rangesOf()[r] {
				s.cidrs[rg] = r
			}
			class(classKey{cidr: r})
		default:
			for _, a := range addrsOf[r] {
				c := classKey{remote: r}
				if id := d.engine.CIDRIdentity(a); remotes[id] > 0 && id.IsCIDR() {
					c.cidr = id
				}
				s.pods[a] = c
				class(c)
			}
		}
	}
	return s
}

// collectTiers turns what changed into pending units: the units of the
// changed keys (marked as they are filed), of identities whose isolation
// changed, of addresses whose owner changed; every unit when the prefixes
// in use changed (a unit's CIDR classes depend only on its own rules).
func (d *Datapath) collectTiers(ch policy.Changes) {
	for id := range ch.Isolation {
		d.markUnits(id)
	}
	if d.dirty.all || len(ch.Prefixes) > 0 {
		for u := range d.inst.units {
			d.dirty.units[u] = struct{}{}
		}
		for u := range d.tiers.remotes {
			d.dirty.units[u] = struct{}{}
		}
	}
	if d.dirty.all {
		for _, r := range d.eps {
			d.markUnits(r.Identity)
		}
	}
	if len(d.dirty.addrs) == 0 || (len(d.inst.units) == 0 && len(d.tiers.remotes) == 0) {
		return
	}
	local := d.localOwners()
	for a := range d.dirty.addrs {
		for u := range d.inst.tierAddrs[a] {
			d.dirty.units[u] = struct{}{}
		}
		if id, ok := d.owner(a, local); ok {
			for u := range d.tiers.byRemote[id] {
				d.dirty.units[u] = struct{}{}
			}
		}
	}
}

// writeTiers brings each pending unit in line: its maps, dispatch and
// class chains created with it, class chains rewritten where their rules
// changed, map elements by difference, and everything removed with it.
func (d *Datapath) writeTiers(t *txn) {
	if len(d.dirty.units) == 0 {
		return
	}
	// The addresses of the identities with tier rules, by owner as the
	// pods maps resolve them.
	addrsOf := map[identity.ID][]netip.Addr{}
	local := d.localOwners()
	addAddr := func(a netip.Addr) {
		if id, ok := d.owner(a, local); ok && len(d.tiers.byRemote[id]) > 0 {
			addrsOf[id] = append(addrsOf[id], a)
		}
	}
	for a := range local {
		addAddr(a)
	}
	for _, a := range d.nodeIPs {
		if _, ok := local[a]; !ok {
			addAddr(a)
		}
	}
	for a := range d.remote {
		if _, ok := local[a]; !ok {
			addAddr(a)
		}
	}
	var ranges map[identity.ID][]addrRange
	rangesOf := func() map[identity.ID][]addrRange {
		if ranges == nil {
			prefixes := map[netip.Prefix]identity.ID{}
			d.engine.Prefixes(func(p netip.Prefix, id identity.ID) { prefixes[p] = id })
			ranges = map[identity.ID][]addrRange{}
			for r, id := range cidrRanges(prefixes) {
				ranges[id] = append(ranges[id], r)
			}
		}
		return ranges
	}
	for u := range d.dirty.units {
		d.writeUnit(t, u, d.wantUnit(u, addrsOf, rangesOf), d.inst.units[u])
	}
}

func (d *Datapath) writeUnit(t *txn, u tierUnit, want, have *unitState) {
	tab := d.lay.table
	chain := func(name string) *nftables.Chain { return &nftables.Chain{Table: tab, Name: name} }
	if want == nil {
		if have == nil {
			return
		}
		// Doomed, emptied last: this transaction rewrites the endpoint
		// chains that jumped here.
		for _, s := range tierSets(tab, u) {
			d.doomSet(t, s)
		}
		for cl := range have.classes {
			d.doomChain(t, chain(classChain(u, cl)))
		}
		d.doomChain(t, chain(dispatchChain(u)))
		t.commit = append(t.commit, func() { d.forgetUnit(u, have) })
		return
	}
	created := have == nil
	if created {
		have = newUnitState()
		for _, s := range tierSets(tab, u) {
			d.createSet(t, s)
		}
		d.createChain(t, chain(dispatchChain(u)))
	}
	// Class chains first: the dispatch chain and the elements name them.
	for cl, cs := range want.classes {
		hs, had := have.classes[cl]
		if !had {
			d.createChain(t, chain(classChain(u, cl)))
		}
		if !had || !hs.known || !slices.Equal(hs.elems, cs.elems) {
			t.rewrite(chain(classChain(u, cl)), classRules(u, cs.elems))
		}
	}
	if !have.known {
		t.rewrite(chain(dispatchChain(u)), dispatchRules(u))
	}
	gotoClass := func(cl classKey) *expr.Verdict {
		return &expr.Verdict{Kind: expr.VerdictGoto, Chain: classChain(u, cl)}
	}
	podsSet := func(a netip.Addr) *nftables.Set {
		return &nftables.Set{Table: tab, Name: tierPodsSet(u, a.Is6()), IsMap: true}
	}
	for a, cl := range have.pods {
		if w, ok := want.pods[a]; !ok || w != cl {
			t.elems(podsSet(a), true, []nftables.SetElement{{Key: a.AsSlice()}})
		}
	}
	for a, cl := range want.pods {
		if h, ok := have.pods[a]; !ok || h != cl {
			t.elems(podsSet(a), false, []nftables.SetElement{{Key: a.AsSlice(), VerdictData: gotoClass(cl)}})
		}
	}
	cidrsSet := func(r addrRange) *nftables.Set {
		return &nftables.Set{Table: tab, Name: tierCIDRsSet(u, r.lo.Is6()), IsMap: true, Interval: true, Concatenation: true}
	}
	for r, id := range have.cidrs {
		if w, ok := want.cidrs[r]; !ok || w != id {
			lo, hi := cidrElem{r: r}.key()
			t.elems(cidrsSet(r), true, []nftables.SetElement{{Key: lo, KeyEnd: hi}})
		}
	}
	for r, id := range want.cidrs {
		if h, ok := have.cidrs[r]; !ok || h != id {
			lo, hi := cidrElem{r: r}.key()
			t.elems(cidrsSet(r), false, []nftables.SetElement{{Key: lo, KeyEnd: hi, VerdictData: gotoClass(classKey{cidr: id})}})
		}
	}
	// Class chains no element names any more go after the elements.
	for cl := range have.classes {
		if _, ok := want.classes[cl]; !ok {
			d.doomChain(t, chain(classChain(u, cl)))
		}
	}
	if created {
		t.ops++
	}
	t.commit = append(t.commit, func() {
		if old := d.inst.units[u]; old != nil {
			d.forgetUnit(u, old)
		}
		d.inst.units[u] = want
		for a := range want.pods {
			if d.inst.tierAddrs[a] == nil {
				d.inst.tierAddrs[a] = map[tierUnit]struct{}{}
			}
			d.inst.tierAddrs[a][u] = struct{}{}
		}
	})
}

// forgetUnit drops unit u's state s from the mirror.
func (d *Datapath) forgetUnit(u tierUnit, s *unitState) {
	delete(d.inst.units, u)
	for a := range s.pods {
		delete(d.inst.tierAddrs[a], u)
		if len(d.inst.tierAddrs[a]) == 0 {
			delete(d.inst.tierAddrs, a)
		}
	}
}

// adoptUnit returns the mirror of unit u read from the table at start.
func (d *Datapath) adoptUnit(u tierUnit) *unitState {
	s := d.inst.units[u]
	if s == nil {
		s = newUnitState()
		d.inst.units[u] = s
	}
	return s
}

// adoptTierElem records an element of a unit's map read at start.
func (d *Datapath) adoptTierElem(u tierUnit, cidr bool, e nftables.SetElement) {
	cu, cl, ok := parseClassChain(verdictChain(e.Val))
	if !ok || cu != u {
		return
	}
	s := d.adoptUnit(u)
	if !cidr {
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			s.pods[a] = cl
			if d.inst.tierAddrs[a] == nil {
				d.inst.tierAddrs[a] = map[tierUnit]struct{}{}
			}
			d.inst.tierAddrs[a][u] = struct{}{}
		}
		return
	}
	if r, ok := rangeOf(e); ok {
		s.cidrs[r] = cl.cidr
	}
}
