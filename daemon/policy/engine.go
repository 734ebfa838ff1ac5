package policy

import (
	"fmt"
	"maps"
	"net/netip"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
	"k8s.io/apimachinery/pkg/labels"
)

// Engine is the incremental matcher, the second stage of the pipeline: it
// keeps normalized policies (policyir.Policy), namespaces and identities, and the
// rules they produce for the local identities (those with endpoints on this
// node). Every change costs work proportional to what it touches: a new
// identity is matched only against the policies whose selectors are filed
// under one of its labels (plus the few label-less selectors), a new policy
// only against the identities its selectors are filed under. Policies that
// select no local identity are kept but not expanded ("inactive"): their
// peers cost nothing until a local pod needs them.
//
// The engine records what each operation touched (TakeChanges); the map
// writer rewrites only those entries. It is not safe for concurrent use.
type Engine struct {
	cidrs      *identity.CIDRs
	ids        map[identity.ID]*idState
	namespaces map[string]*nsState
	policies   map[string]*polState
	// cluster are the ClusterNetworkPolicies, filed by their subject's
	// namespace selector over namespace labels: a local identity is checked
	// against those that may select its namespace.
	cluster *selectorIndex[*polState]
	// nsPeers are active peers with a namespace selector, filed by that
	// selector over namespace labels.
	nsPeers *selectorIndex[*peerState]
	// cidrPeers are active ipBlock peers.
	cidrPeers map[*peerState]struct{}
	// nodes are the cluster's nodes; nodePeers the active nodes peers,
	// filed by their node selector over node labels (nodes.go).
	nodes     map[string]*nodeState
	nodePeers *selectorIndex[*peerState]
	prefixes  map[netip.Prefix]*prefixState
	// prefixLens counts prefixes per (family, length), for longest-prefix
	// lookups that cost at most one map probe per length in use.
	prefixLens map[prefixLen]int
	rules      map[Rule]int
	keys       map[Key]int
	// tiers are the tier entries of each key (tiers.go).
	tiers     tierKeys
	isolation map[identity.ID]*isoCount
	named     namedPortState
	changes   Changes
	// Errors of the last operations (e.g. CIDR identity space exhausted).
	errs []error
}

type idState struct {
	identity.Identity
	ns         *nsState
	announced  bool // known through UpsertIdentity
	localRefs  int
	selectedBy map[*polState]struct{}
	matchedBy  map[*peerState]struct{}
}

func (s *idState) local() bool { return s.localRefs > 0 }

type nsState struct {
	name   string
	labels labels.Set // object labels plus the name label
	ids    *labelSetIndex[*idState]
	// subjects are this namespace's policies, by podSelector.
	subjects *selectorIndex[*polState]
	// peers are active pod peers that may match pods here, by podSelector.
	peers *selectorIndex[*peerState]
}

type polState struct {
	p        *policyir.Policy
	ns       *nsState // nil for a cluster policy
	selected map[identity.ID]struct{}
	peers    []*peerState // set while active
}

func (p *polState) active() bool { return p.peers != nil }

type peerState struct {
	pol  *polState
	rule *policyir.Rule
	peer *policyir.Peer // nil: every peer (identity.Any)
	// namespaces the peer is filed in (pod peers).
	inNS    []*nsState
	matched map[identity.ID]struct{}
	// nodes are the prefixes a nodes peer matches of each node it
	// selects; nodePrefixes counts them (two nodes may share one).
	nodes        map[string][]netip.Prefix
	nodePrefixes map[netip.Prefix]int
}

type prefixState struct {
	id   identity.ID
	refs int
}

type prefixLen struct {
	v4   bool
	bits int
}

// isoCount counts the NetworkPolicies isolating an identity per direction,
// and the cluster policies with rules for it per direction.
type isoCount struct{ ingress, egress, ingressTier, egressTier int }

func (c *isoCount) value() Isolation {
	var i Isolation
	for _, b := range []struct {
		n    int
		flag Isolation
	}{{c.ingress, IngressIsolated}, {c.egress, EgressIsolated}, {c.ingressTier, IngressTiered}, {c.egressTier, EgressTiered}} {
		if b.n > 0 {
			i |= b.flag
		}
	}
	return i
}

func (c *isoCount) empty() bool {
	return c.ingress == 0 && c.egress == 0 && c.ingressTier == 0 && c.egressTier == 0
}

// add counts policy p for the identity (delta 1) or stops counting it (-1).
func (c *isoCount) add(p *policyir.Policy, delta int) {
	if !p.Cluster() {
		if p.IsolatesIngress {
			c.ingress += delta
		}
		if p.IsolatesEgress {
			c.egress += delta
		}
		return
	}
	in, eg := false, false
	for i := range p.Rules {
		in = in || p.Rules[i].Direction == Ingress
		eg = eg || p.Rules[i].Direction == Egress
	}
	if in {
		c.ingressTier += delta
	}
	if eg {
		c.egressTier += delta
	}
}

// Changes are the outputs an engine operation may have changed; consumers
// read the current value of each from the engine.
type Changes struct {
	Keys      map[Key]struct{}
	Isolation map[identity.ID]struct{}
	Prefixes  map[netip.Prefix]struct{}
}

func newChanges() Changes {
	return Changes{Keys: map[Key]struct{}{}, Isolation: map[identity.ID]struct{}{}, Prefixes: map[netip.Prefix]struct{}{}}
}

// Empty reports whether nothing changed.
func (c Changes) Empty() bool {
	return len(c.Keys) == 0 && len(c.Isolation) == 0 && len(c.Prefixes) == 0
}

// NewEngine returns an empty engine numbering ipBlock prefixes from cidrs.
func NewEngine(cidrs *identity.CIDRs) *Engine {
	return &Engine{
		cidrs: cidrs, ids: map[identity.ID]*idState{}, namespaces: map[string]*nsState{},
		policies: map[string]*polState{}, cluster: newSelectorIndex[*polState](), tiers: newTierKeys(), nsPeers: newSelectorIndex[*peerState](),
		cidrPeers: map[*peerState]struct{}{}, nodes: map[string]*nodeState{}, nodePeers: newSelectorIndex[*peerState](), prefixes: map[netip.Prefix]*prefixState{},
		prefixLens: map[prefixLen]int{}, rules: map[Rule]int{}, keys: map[Key]int{},
		isolation: map[identity.ID]*isoCount{}, named: newNamedPortState(), changes: newChanges(),
	}
}

// TakeChanges returns what changed since the last call and resets it.
func (e *Engine) TakeChanges() Changes {
	c := e.changes
	e.changes = newChanges()
	return c
}

// TakeErrors returns errors of operations since the last call (the
// operations themselves complete; e.g. a peer without a CIDR identity
// matches nothing, which fails closed).
func (e *Engine) TakeErrors() []error {
	errs := e.errs
	e.errs = nil
	return errs
}

// WantsKey reports whether the policy map should hold k.
func (e *Engine) WantsKey(k Key) bool { return e.keys[k] > 0 || e.tiers.has(k) }

// Keys calls fn for every wanted policy key.
func (e *Engine) Keys(fn func(Key)) {
	for k := range e.keys {
		fn(k)
	}
	e.tiers.each(func(k Key) {
		if e.keys[k] == 0 {
			fn(k)
		}
	})
}

// Isolation returns the directions isolated for local identity id.
func (e *Engine) Isolation(id identity.ID) Isolation {
	if c := e.isolation[id]; c != nil {
		return c.value()
	}
	return 0
}

// PrefixIdentity returns the identity of ipBlock prefix p if in use.
func (e *Engine) PrefixIdentity(p netip.Prefix) (identity.ID, bool) {
	s, ok := e.prefixes[p]
	if !ok {
		return 0, false
	}
	return s.id, true
}

// Prefixes calls fn for every ipBlock prefix in use.
func (e *Engine) Prefixes(fn func(netip.Prefix, identity.ID)) {
	for p, s := range e.prefixes {
		fn(p, s.id)
	}
}

// Identity returns the namespace and labels of a known pod identity.
func (e *Engine) Identity(id identity.ID) (identity.Identity, bool) {
	s, ok := e.ids[id]
	if !ok {
		return identity.Identity{}, false
	}
	return identity.Identity{ID: s.ID, Namespace: s.Namespace, Labels: maps.Clone(s.Labels)}, true
}

// PrefixOf returns the ipBlock prefix a CIDR identity stands for.
func (e *Engine) PrefixOf(id identity.ID) (netip.Prefix, bool) {
	for p, s := range e.prefixes {
		if s.id == id {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// CIDRIdentity returns the identity of the longest prefix in use that
// contains addr, or identity.World: what the ipcache resolves addr's CIDR to.
func (e *Engine) CIDRIdentity(addr netip.Addr) identity.ID {
	addr = addr.Unmap()
	best, bits := identity.World, -1
	for l := range e.prefixLens {
		if l.v4 != addr.Is4() || l.bits <= bits {
			continue
		}
		p, err := addr.Prefix(l.bits)
		if err != nil {
			continue
		}
		if s, ok := e.prefixes[p]; ok {
			best, bits = s.id, l.bits
		}
	}
	return best
}

// --- namespaces ---

func (e *Engine) namespace(name string) *nsState {
	ns := e.namespaces[name]
	if ns == nil {
		ns = &nsState{name: name, labels: labels.Set{NamespaceNameLabel: name},
			ids: newLabelSetIndex[*idState](), subjects: newSelectorIndex[*polState](), peers: newSelectorIndex[*peerState]()}
		e.namespaces[name] = ns
		// Peers selecting namespaces by label may match the new one.
		e.nsPeers.candidates(ns.labels, func(q *peerState) {
			if q.peer.NamespaceSelector.Matches(ns.labels) {
				e.fileInNamespace(q, ns)
			}
		})
	}
	return ns
}

// SetNamespace sets the labels of namespace name (nil: the namespace object
// is gone; it keeps only its name label). Cost: the namespace-selecting
// peers filed under its old or new labels, and the identities in it they
// select.
func (e *Engine) SetNamespace(name string, lbls map[string]string) {
	ns := e.namespace(name)
	next := labels.Set(maps.Clone(lbls))
	if next == nil {
		next = labels.Set{}
	}
	next[NamespaceNameLabel] = name
	if maps.Equal(ns.labels, next) {
		return
	}
	prev := ns.labels
	defer e.reselectCluster(ns, prev)
	affected := map[*peerState]struct{}{}
	collect := func(q *peerState) { affected[q] = struct{}{} }
	e.nsPeers.candidates(prev, collect)
	e.nsPeers.candidates(next, collect)
	ns.labels = next
	for q := range affected {
		was, now := q.peer.NamespaceSelector.Matches(prev), q.peer.NamespaceSelector.Matches(next)
		switch {
		case was && !now:
			e.unfileFromNamespace(q, ns)
		case now && !was:
			e.fileInNamespace(q, ns)
		}
	}
}

// fileInNamespace makes pod peer q consider namespace ns.
func (e *Engine) fileInNamespace(q *peerState, ns *nsState) {
	q.inNS = append(q.inNS, ns)
	ns.peers.add(q.peer.PodSelector, q)
	ns.ids.candidates(q.peer.PodSelector, func(s *idState) {
		if q.peer.PodSelector.Matches(labels.Set(s.Labels)) {
			e.match(q, s.ID)
		}
	})
}

func (e *Engine) unfileFromNamespace(q *peerState, ns *nsState) {
	for i, n := range q.inNS {
		if n == ns {
			q.inNS = append(q.inNS[:i], q.inNS[i+1:]...)
			break
		}
	}
	ns.peers.remove(q.peer.PodSelector, q)
	ns.ids.candidates(q.peer.PodSelector, func(s *idState) {
		if _, ok := q.matched[s.ID]; ok {
			e.unmatch(q, s.ID)
		}
	})
}

// --- identities ---

// UpsertIdentity announces an identity that exists in the cluster (local
// or not), so policies can select it as a peer. An identity whose
// namespace or labels change is re-matched from scratch.
func (e *Engine) UpsertIdentity(id identity.Identity) {
	s := e.ids[id.ID]
	if s != nil && (s.Namespace != id.Namespace || !maps.Equal(s.Labels, id.Labels)) {
		refs := s.localRefs
		e.unlinkIdentity(s)
		delete(e.ids, id.ID)
		s = e.linkIdentity(id)
		if refs > 0 {
			s.localRefs = refs
			e.selectAsLocal(s)
		}
	}
	if s == nil {
		s = e.linkIdentity(id)
	}
	s.announced = true
}

// DeleteIdentity withdraws an announcement; local endpoints keep their
// identity until RemoveLocal.
func (e *Engine) DeleteIdentity(id identity.ID) {
	s := e.ids[id]
	if s == nil {
		return
	}
	s.announced = false
	if !s.local() {
		e.unlinkIdentity(s)
		delete(e.ids, id)
	}
}

// AddLocal takes a local reference to id (one per endpoint on this node),
// making it known if needed. The first reference selects it for the
// policies that apply to it: their rules are expanded for it.
func (e *Engine) AddLocal(id identity.Identity) {
	s := e.ids[id.ID]
	if s == nil || s.Namespace != id.Namespace || !maps.Equal(s.Labels, id.Labels) {
		announced := s != nil && s.announced
		e.UpsertIdentity(id)
		s = e.ids[id.ID]
		s.announced = announced
	}
	s.localRefs++
	if s.localRefs == 1 {
		e.selectAsLocal(s)
	}
}

// RemoveLocal drops a local reference; with the last one its rules go, and
// an identity nobody announced is forgotten.
func (e *Engine) RemoveLocal(id identity.ID) {
	s := e.ids[id]
	if s == nil || s.localRefs == 0 {
		return
	}
	s.localRefs--
	if s.localRefs > 0 {
		return
	}
	for p := range s.selectedBy {
		e.unselect(p, s)
	}
	if !s.announced {
		e.unlinkIdentity(s)
		delete(e.ids, id)
	}
}

// linkIdentity files a new identity and matches it against the peers that
// may select it.
func (e *Engine) linkIdentity(id identity.Identity) *idState {
	ns := e.namespace(id.Namespace)
	s := &idState{Identity: identity.Identity{ID: id.ID, Namespace: id.Namespace, Labels: maps.Clone(id.Labels)},
		ns: ns, selectedBy: map[*polState]struct{}{}, matchedBy: map[*peerState]struct{}{}}
	e.ids[id.ID] = s
	ns.ids.add(s.Labels, s)
	ns.peers.candidates(s.Labels, func(q *peerState) {
		if q.peer.PodSelector.Matches(labels.Set(s.Labels)) {
			e.match(q, s.ID)
		}
	})
	return s
}

func (e *Engine) unlinkIdentity(s *idState) {
	for p := range s.selectedBy {
		e.unselect(p, s)
	}
	for q := range s.matchedBy {
		e.unmatch(q, s.ID)
	}
	s.ns.ids.remove(s.Labels, s)
}

// selectAsLocal applies the policies that select s: those of its
// namespace, and the cluster policies whose subject matches it.
func (e *Engine) selectAsLocal(s *idState) {
	s.ns.subjects.candidates(s.Labels, func(p *polState) {
		if p.p.PodSelector.Matches(labels.Set(s.Labels)) {
			e.selectIdentity(p, s)
		}
	})
	e.cluster.candidates(s.ns.labels, func(p *polState) {
		if clusterSelects(p.p, s) {
			e.selectIdentity(p, s)
		}
	})
}

func clusterSelects(p *policyir.Policy, s *idState) bool {
	return p.NamespaceSelector.Matches(s.ns.labels) && p.PodSelector.Matches(labels.Set(s.Labels))
}

// reselectCluster re-applies the cluster policies filed under the old or
// new labels of ns to its local identities after its labels changed. Cost:
// those policies × local identities of the namespace.
func (e *Engine) reselectCluster(ns *nsState, prev labels.Set) {
	affected := map[*polState]struct{}{}
	collect := func(p *polState) { affected[p] = struct{}{} }
	e.cluster.candidates(prev, collect)
	e.cluster.candidates(ns.labels, collect)
	if len(affected) == 0 {
		return
	}
	for s := range ns.ids.all {
		if !s.local() {
			continue
		}
		for p := range affected {
			_, was := p.selected[s.ID]
			switch now := clusterSelects(p.p, s); {
			case now && !was:
				e.selectIdentity(p, s)
			case was && !now:
				e.unselect(p, s)
			}
		}
	}
}

// --- policies ---

// UpsertPolicy adds or replaces a normalized policy. Cost: the identities
// it selects and, if it selects a local one, its peers' matches.
func (e *Engine) UpsertPolicy(p *policyir.Policy) {
	e.DeletePolicy(p.Namespace, p.Name)
	if p.Cluster() {
		ps := &polState{p: p, selected: map[identity.ID]struct{}{}}
		e.policies[p.Key()] = ps
		e.cluster.add(p.NamespaceSelector, ps)
		for _, s := range e.ids {
			if s.local() && clusterSelects(p, s) {
				e.selectIdentity(ps, s)
			}
		}
		return
	}
	ns := e.namespace(p.Namespace)
	ps := &polState{p: p, ns: ns, selected: map[identity.ID]struct{}{}}
	e.policies[p.Key()] = ps
	ns.subjects.add(p.PodSelector, ps)
	ns.ids.candidates(p.PodSelector, func(s *idState) {
		if s.local() && p.PodSelector.Matches(labels.Set(s.Labels)) {
			e.selectIdentity(ps, s)
		}
	})
}

// DeletePolicy removes a policy and everything it produced.
func (e *Engine) DeletePolicy(namespace, name string) {
	ps := e.policies[namespace+"/"+name]
	if ps == nil {
		return
	}
	for id := range ps.selected {
		e.unselect(ps, e.ids[id])
	}
	if ps.active() {
		e.deactivate(ps)
	}
	if ps.ns != nil {
		ps.ns.subjects.remove(ps.p.PodSelector, ps)
	} else {
		e.cluster.remove(ps.p.NamespaceSelector, ps)
	}
	delete(e.policies, namespace+"/"+name)
}

// Policy returns the normalized policy namespace/name, if present.
func (e *Engine) Policy(namespace, name string) (*policyir.Policy, bool) {
	ps := e.policies[namespace+"/"+name]
	if ps == nil {
		return nil, false
	}
	return ps.p, true
}

func (e *Engine) selectIdentity(p *polState, s *idState) {
	if !p.active() {
		e.activate(p)
	}
	p.selected[s.ID] = struct{}{}
	s.selectedBy[p] = struct{}{}
	c := e.isolation[s.ID]
	if c == nil {
		c = &isoCount{}
		e.isolation[s.ID] = c
	}
	c.add(p.p, 1)
	e.changes.Isolation[s.ID] = struct{}{}
	for _, q := range p.peers {
		for r := range q.matched {
			e.link(s.ID, q, r, 1)
		}
	}
}

func (e *Engine) unselect(p *polState, s *idState) {
	for _, q := range p.peers {
		for r := range q.matched {
			e.link(s.ID, q, r, -1)
		}
	}
	delete(p.selected, s.ID)
	delete(s.selectedBy, p)
	if c := e.isolation[s.ID]; c != nil {
		c.add(p.p, -1)
		if c.empty() {
			delete(e.isolation, s.ID)
		}
	}
	e.changes.Isolation[s.ID] = struct{}{}
	if len(p.selected) == 0 && p.active() {
		e.deactivate(p)
	}
}

// activate expands a policy's peers once it selects a local identity.
func (e *Engine) activate(p *polState) {
	p.peers = []*peerState{}
	for i := range p.p.Rules {
		rule := &p.p.Rules[i]
		if rule.NoPorts {
			continue
		}
		if len(rule.Peers) == 0 {
			q := &peerState{pol: p, rule: rule, matched: map[identity.ID]struct{}{identity.Any: {}}}
			p.peers = append(p.peers, q)
			e.named.use(q, 1)
			continue
		}
		for j := range rule.Peers {
			q := &peerState{pol: p, rule: rule, peer: &rule.Peers[j], matched: map[identity.ID]struct{}{}}
			p.peers = append(p.peers, q)
			e.named.use(q, 1)
			e.activatePeer(q)
		}
	}
}

func (e *Engine) activatePeer(q *peerState) {
	if b := q.peer.Block; b != nil {
		e.cidrPeers[q] = struct{}{}
		for _, pfx := range b.Prefixes() {
			e.refPrefix(pfx)
		}
		// Every prefix in use inside the block and outside its exceptions:
		// the ipcache resolves an address to its longest known prefix, which
		// is inside the block exactly when the address is.
		for pfx, s := range e.prefixes {
			if b.Covers(pfx) {
				e.match(q, s.id)
			}
		}
		return
	}
	if q.peer.NodeSelector != nil {
		e.activateNodePeer(q)
		return
	}
	if q.peer.NamespaceSelector == nil {
		e.fileInNamespace(q, q.pol.ns)
		return
	}
	e.nsPeers.add(q.peer.NamespaceSelector, q)
	for _, ns := range e.namespaces {
		if q.peer.NamespaceSelector.Matches(ns.labels) {
			e.fileInNamespace(q, ns)
		}
	}
}

func (e *Engine) deactivate(p *polState) {
	for _, q := range p.peers {
		for r := range q.matched {
			e.unmatch(q, r)
		}
		e.named.use(q, -1)
		switch {
		case q.peer == nil:
		case q.peer.Block != nil:
			delete(e.cidrPeers, q)
			for _, pfx := range q.peer.Block.Prefixes() {
				e.unrefPrefix(pfx)
			}
		case q.peer.NodeSelector != nil:
			e.deactivateNodePeer(q)
		default:
			if q.peer.NamespaceSelector != nil {
				e.nsPeers.remove(q.peer.NamespaceSelector, q)
			}
			for _, ns := range q.inNS {
				ns.peers.remove(q.peer.PodSelector, q)
			}
			q.inNS = nil
		}
	}
	p.peers = nil
}

// --- prefixes ---

func (e *Engine) refPrefix(p netip.Prefix) {
	if s := e.prefixes[p]; s != nil {
		s.refs++
		return
	}
	id, err := e.cidrs.Get(p)
	if err != nil {
		// No identity: the prefix stays unknown to the ipcache, and peers
		// naming it match nothing through it (fail closed).
		e.errs = append(e.errs, fmt.Errorf("ipBlock %s: %w", p, err))
		return
	}
	e.prefixes[p] = &prefixState{id: id, refs: 1}
	e.prefixLens[prefixLen{p.Addr().Is4(), p.Bits()}]++
	e.changes.Prefixes[p] = struct{}{}
	for q := range e.cidrPeers {
		if q.peer.Block.Covers(p) {
			e.match(q, id)
		}
	}
}

func (e *Engine) unrefPrefix(p netip.Prefix) {
	s := e.prefixes[p]
	if s == nil {
		return
	}
	if s.refs--; s.refs > 0 {
		return
	}
	for q := range e.cidrPeers {
		if _, ok := q.matched[s.id]; ok {
			e.unmatch(q, s.id)
		}
	}
	delete(e.prefixes, p)
	l := prefixLen{p.Addr().Is4(), p.Bits()}
	if e.prefixLens[l]--; e.prefixLens[l] == 0 {
		delete(e.prefixLens, l)
	}
	e.cidrs.Release(p)
	e.changes.Prefixes[p] = struct{}{}
}

// --- rules ---

func (e *Engine) match(q *peerState, r identity.ID) {
	if _, ok := q.matched[r]; ok {
		return
	}
	q.matched[r] = struct{}{}
	if s := e.ids[r]; s != nil {
		s.matchedBy[q] = struct{}{}
	}
	for local := range q.pol.selected {
		e.link(local, q, r, 1)
	}
}

func (e *Engine) unmatch(q *peerState, r identity.ID) {
	if _, ok := q.matched[r]; !ok {
		return
	}
	for local := range q.pol.selected {
		e.link(local, q, r, -1)
	}
	delete(q.matched, r)
	if s := e.ids[r]; s != nil {
		delete(s.matchedBy, q)
	}
}

var allTraffic = []policyir.PortRange{{Protocol: ProtoAny, First: 0, Last: 65535}}

// link adds (delta 1) or removes (-1) the rules of q's rule between local
// and remote: its numeric ports, and its named ports as resolved now.
func (e *Engine) link(local identity.ID, q *peerState, remote identity.ID, delta int) {
	base := linkBase(local, q, remote)
	if q.rule.AllTraffic() {
		e.linkRanges(base, allTraffic, delta)
		return
	}
	e.linkRanges(base, q.rule.Ports, delta)
	if len(q.rule.NamedPorts) > 0 {
		e.linkRanges(base, e.namedRanges(local, q, remote), delta)
	}
}

// linkBase is the rule of q between local and remote, without its ports.
func linkBase(local identity.ID, q *peerState, remote identity.ID) Rule {
	base := Rule{Local: local, Remote: remote, Dir: q.rule.Direction}
	if p := q.pol.p; p.Cluster() {
		base.Tier, base.Action, base.Rank = p.Tier, q.rule.Action, p.Rank(q.rule)
	}
	return base
}

func (e *Engine) linkRanges(base Rule, ports []policyir.PortRange, delta int) {
	for _, pr := range ports {
		r := base
		r.Proto, r.PortLo, r.PortHi = pr.Protocol, pr.First, pr.Last
		n := e.rules[r] + delta
		switch {
		case n > 0:
			e.rules[r] = n
		default:
			delete(e.rules, r)
		}
		if (delta > 0 && n == 1) || (delta < 0 && n == 0) {
			for _, k := range r.Keys() {
				if r.Tier != policyir.TierNetworkPolicy {
					e.refTier(k, tierEntry{action: r.Action, rank: r.Rank}, delta)
				} else {
					e.refKey(k, delta)
				}
			}
		}
	}
}

func (e *Engine) refKey(k Key, delta int) {
	n := e.keys[k] + delta
	if n > 0 {
		e.keys[k] = n
	} else {
		delete(e.keys, k)
	}
	if delta > 0 && n == 1 {
		setAdd(e.tiers.np, k)
	} else if delta < 0 && n == 0 {
		setRemove(e.tiers.np, k)
	}
	if (delta > 0 && n == 1) || (delta < 0 && n == 0) {
		e.changes.Keys[k] = struct{}{}
		// Tier keys below k carry whether NetworkPolicy allows there.
		e.tiers.below(k, func(d Key) { e.changes.Keys[d] = struct{}{} })
	}
}

// Rules calls fn for every rule in force.
func (e *Engine) Rules(fn func(Rule)) {
	for r := range e.rules {
		fn(r)
	}
}

// Warnings returns the warnings of the policies that select a local identity.
func (e *Engine) Warnings() []string {
	var out []string
	for _, p := range e.policies {
		if p.active() {
			out = append(out, p.p.Warnings...)
		}
	}
	return out
}
