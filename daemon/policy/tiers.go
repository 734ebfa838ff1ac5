package policy

import (
	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
)

// Tiers folded into the policy map. ClusterNetworkPolicy rules become keys
// of the same LPM trie as NetworkPolicy allows, and every key's value
// (policy_value.flags, see bpf/coordino.h) carries the verdict of all
// rules whose keys contain it: the LPM lookup returns only the longest
// key, so that key answers for the shorter ones too.
//
//	bit 0      ValueNoAllow: no NetworkPolicy allow covers the key
//	bits 1-2   the deciding tier rule's action: 0 none, 1 Accept, 2 Deny, 3 Pass
//	bits 3-17  its rank (priority*25 + rule index): the lowest decides
//
// Admin keys use the flow's direction; Baseline keys the direction with
// DirBaseline set, so a flow looks the Baseline tier up only when neither
// the Admin tier nor NetworkPolicy decided it. A key NetworkPolicy alone
// wants has value 0, as before tiers existed.

// DirBaseline is set in the Dir of Baseline tier keys.
const DirBaseline Direction = 2

// Value is a policy map value.
type Value uint32

// ValueNoAllow: the key exists for a tier rule only.
const ValueNoAllow Value = 1

// Where a Value holds the action and the rank.
const (
	valueActionShift = 1
	valueRankShift   = 3
	valueRankMask    = 0x7fff
)

// Tier action codes in a Value.
const (
	codeNone   = 0
	codeAccept = 1
	codeDeny   = 2
	codePass   = 3
)

// Tier returns the deciding tier rule of the key, if any.
func (v Value) Tier() (action policyir.Action, rank uint16, ok bool) {
	rank = uint16(v>>valueRankShift) & valueRankMask
	switch (v >> valueActionShift) & 3 {
	case codeAccept:
		return policyir.ActionAccept, rank, true
	case codeDeny:
		return policyir.ActionDeny, rank, true
	case codePass:
		return policyir.ActionPass, rank, true
	}
	return 0, 0, false
}

// Allows reports whether a NetworkPolicy allow covers the key.
func (v Value) Allows() bool { return v&ValueNoAllow == 0 }

// HasDeny reports whether the value decides Deny: writing it tightens,
// removing it loosens (the map writer's fail-closed order).
func (v Value) HasDeny() bool { a, _, ok := v.Tier(); return ok && a == policyir.ActionDeny }

type tierEntry struct {
	action policyir.Action
	rank   uint16
}

func (t tierEntry) code() Value {
	switch t.action {
	case policyir.ActionDeny:
		return codeDeny
	case policyir.ActionPass:
		return codePass
	}
	return codeAccept
}

// before reports whether t decides ahead of u: lower rank, and at the same
// rank (policies of equal priority, which the API leaves to the
// implementation) Deny, then Pass, then Accept.
func (t tierEntry) before(u tierEntry) bool {
	if t.rank != u.rank {
		return t.rank < u.rank
	}
	return strength(t.action) > strength(u.action)
}

func strength(a policyir.Action) int {
	switch a {
	case policyir.ActionDeny:
		return 2
	case policyir.ActionPass:
		return 1
	}
	return 0
}

// keyGroup is what a key matches exactly: a flow's lookups differ only in
// protocol and port within one group.
type keyGroup struct {
	local, remote identity.ID
	dir           Direction
}

func groupOf(k Key) keyGroup { return keyGroup{k.Local, k.Remote, k.Dir} }

// tierKeys holds the tier entries per key, and per group the keys that
// have tier entries and the NetworkPolicy keys (what a change of one key
// may change the value of).
type tierKeys struct {
	entries map[Key]map[tierEntry]int
	groups  map[keyGroup]map[Key]struct{}
	np      map[keyGroup]map[Key]struct{}
}

func newTierKeys() tierKeys {
	return tierKeys{entries: map[Key]map[tierEntry]int{}, groups: map[keyGroup]map[Key]struct{}{}, np: map[keyGroup]map[Key]struct{}{}}
}

func (t *tierKeys) has(k Key) bool { return len(t.entries[k]) > 0 }

func (t *tierKeys) each(fn func(Key)) {
	for k := range t.entries {
		fn(k)
	}
}

// below calls fn for k and every key of its group it contains, tier or
// NetworkPolicy, when the group has tier entries at all.
func (t *tierKeys) below(k Key, fn func(Key)) {
	g := groupOf(k)
	if len(t.groups[g]) == 0 {
		return
	}
	for _, set := range []map[Key]struct{}{t.groups[g], t.np[g]} {
		for d := range set {
			if contains(k, d) {
				fn(d)
			}
		}
	}
}

func setAdd(m map[keyGroup]map[Key]struct{}, k Key) {
	g := groupOf(k)
	if m[g] == nil {
		m[g] = map[Key]struct{}{}
	}
	m[g][k] = struct{}{}
}

func setRemove(m map[keyGroup]map[Key]struct{}, k Key) {
	g := groupOf(k)
	delete(m[g], k)
	if len(m[g]) == 0 {
		delete(m, g)
	}
}

// contains reports whether key a covers every flow key d covers (both of
// one group).
func contains(a, d Key) bool {
	switch {
	case a.Prefix > d.Prefix:
		return false
	case a.Prefix == PrefixAnyProto:
		return true
	case a.Proto != d.Proto:
		return false
	}
	bits := a.Prefix - PrefixProto
	return d.Port&^(0xffff>>bits) == a.Port
}

// ancestors calls fn for every key that may contain k: k itself, the
// any-protocol key and the protocol's port prefixes down to k's.
func ancestors(k Key, fn func(Key)) {
	a := Key{Prefix: PrefixAnyProto, Local: k.Local, Remote: k.Remote, Dir: k.Dir}
	fn(a)
	if k.Prefix == PrefixAnyProto {
		return
	}
	a.Proto = k.Proto
	for bits := uint32(0); bits <= k.Prefix-PrefixProto; bits++ {
		a.Prefix = PrefixProto + bits
		a.Port = k.Port &^ (0xffff >> bits)
		fn(a)
	}
}

// refTier adds (1) or removes (-1) a tier entry of key k.
func (e *Engine) refTier(k Key, t tierEntry, delta int) {
	m := e.tiers.entries[k]
	if m == nil {
		if delta < 0 {
			return
		}
		m = map[tierEntry]int{}
		e.tiers.entries[k] = m
		setAdd(e.tiers.groups, k)
	}
	n := m[t] + delta
	if n > 0 {
		m[t] = n
	} else {
		delete(m, t)
	}
	if (delta > 0 && n == 1) || (delta < 0 && n == 0) {
		e.changes.Keys[k] = struct{}{}
		e.tiers.below(k, func(d Key) { e.changes.Keys[d] = struct{}{} })
	}
	if len(m) == 0 {
		delete(e.tiers.entries, k)
		setRemove(e.tiers.groups, k)
	}
}

// KeyValue returns the policy map value of wanted key k: 0 for a key of a
// group no tier rule touches.
func (e *Engine) KeyValue(k Key) Value {
	if len(e.tiers.groups[groupOf(k)]) == 0 {
		return 0
	}
	allow := false
	var best tierEntry
	found := false
	ancestors(k, func(a Key) {
		allow = allow || e.keys[a] > 0
		for t := range e.tiers.entries[a] {
			if !found || t.before(best) {
				best, found = t, true
			}
		}
	})
	var v Value
	if !allow || k.Dir&DirBaseline != 0 {
		v |= ValueNoAllow
	}
	if found {
		v |= best.code()<<valueActionShift | Value(best.rank)<<valueRankShift
	}
	return v
}

// Verdict is the decision for a new flow and what made it.
type Verdict struct {
	Allow bool
	// Tier decided: TierNetworkPolicy also stands for "no tier rule and
	// no isolation" (Reason says which).
	Tier   policyir.Tier
	Action policyir.Action
	Rank   uint16
	// Reason is the datapath's flow reason: host, not-isolated, policy
	// (a NetworkPolicy or tier rule accepts), policy-denied, admin-deny,
	// baseline-deny.
	Reason string
}

// Lookup is one LPM lookup of the policy map: the value of the longest
// key covering (local, remote, dir, proto, port).
type Lookup func(Key) (Value, bool)

// lpm finds the longest wanted key covering a full-length key.
func lpm(get Lookup, local, remote identity.ID, dir Direction, proto uint8, port uint16) (Value, bool) {
	k := Key{Local: local, Remote: remote, Dir: dir, Proto: proto}
	for bits := 16; bits >= 0; bits-- {
		k.Prefix = PrefixProto + uint32(bits)
		k.Port = port &^ (0xffff >> bits)
		if v, ok := get(k); ok {
			return v, true
		}
	}
	return get(Key{Prefix: PrefixAnyProto, Local: local, Remote: remote, Dir: dir})
}

// tierLookups folds the three lookups of a flow (its remote identity, its
// CIDR identity, any remote) in one tier's direction: whether a
// NetworkPolicy allow matched, and the deciding tier entry.
func tierLookups(get Lookup, f Flow, dir Direction, port uint16) (allow bool, best tierEntry, found bool) {
	remotes := []identity.ID{f.Remote, f.RemoteCIDR, identity.Any}
	if f.RemoteCIDR == f.Remote {
		remotes = remotes[1:]
	}
	for _, r := range remotes {
		v, ok := lpm(get, f.Local, r, dir, f.Proto, port)
		if !ok {
			continue
		}
		allow = allow || v.Allows()
		if a, rank, ok := v.Tier(); ok {
			if t := (tierEntry{action: a, rank: rank}); !found || t.before(best) {
				best, found = t, true
			}
		}
	}
	return allow, best, found
}

// Decide decides a new flow from the policy map as the BPF program does
// (bpf/lib/policy.h, decide): traffic from the node passes; a direction
// nothing enforces is open; else the Admin tier's deciding rule (Accept
// and Deny final, Pass on), then NetworkPolicy when it isolates the
// direction, then the Baseline tier, then allow.
func Decide(get Lookup, f Flow) Verdict {
	if f.Dir == Ingress && f.Remote == identity.Host {
		return Verdict{Allow: true, Reason: "host"}
	}
	if !f.Isolation.Enforced(f.Dir) {
		return Verdict{Allow: true, Reason: "not-isolated"}
	}
	port := f.Port
	if f.Proto != ProtoTCP && f.Proto != ProtoUDP && f.Proto != ProtoSCTP {
		port = 0
	}
	allow, admin, found := tierLookups(get, f, f.Dir, port)
	if found && admin.action != policyir.ActionPass {
		v := Verdict{Allow: admin.action == policyir.ActionAccept, Tier: policyir.TierAdmin, Action: admin.action, Rank: admin.rank, Reason: "policy"}
		if !v.Allow {
			v.Reason = "admin-deny"
		}
		return v
	}
	if f.Isolation.Has(f.Dir) {
		if allow {
			return Verdict{Allow: true, Reason: "policy"}
		}
		return Verdict{Reason: "policy-denied"}
	}
	_, base, found := tierLookups(get, f, f.Dir|DirBaseline, port)
	if found && base.action != policyir.ActionPass {
		v := Verdict{Allow: base.action == policyir.ActionAccept, Tier: policyir.TierBaseline, Action: base.action, Rank: base.rank, Reason: "policy"}
		if !v.Allow {
			v.Reason = "baseline-deny"
		}
		return v
	}
	return Verdict{Allow: true, Reason: "not-isolated"}
}

// EngineLookup reads the engine's wanted keys as the map would hold them.
func (e *Engine) EngineLookup(k Key) (Value, bool) {
	if !e.WantsKey(k) {
		return 0, false
	}
	return e.KeyValue(k), true
}

// TierRule is one key's own deciding tier entry, not folded with the keys
// containing it: what a datapath that orders the rules itself (nftables)
// renders, where the eBPF map's value carries the fold.
type TierRule struct {
	Action policyir.Action
	Rank   uint16
}

// Before reports whether r decides ahead of s (the order of Decide).
func (r TierRule) Before(s TierRule) bool {
	return tierEntry{action: r.Action, rank: r.Rank}.before(tierEntry{action: s.Action, rank: s.Rank})
}

// KeyTier returns the deciding tier entry among the ClusterNetworkPolicy
// rules of key k itself, if any.
func (e *Engine) KeyTier(k Key) (TierRule, bool) {
	var best tierEntry
	found := false
	for t := range e.tiers.entries[k] {
		if !found || t.before(best) {
			best, found = t, true
		}
	}
	return TierRule{Action: best.action, Rank: best.rank}, found
}

// AllowsKey reports whether a NetworkPolicy allow wants key k.
func (e *Engine) AllowsKey(k Key) bool { return e.keys[k] > 0 }
