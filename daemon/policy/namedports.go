package policy

import (
	"cmp"
	"slices"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
)

// Named ports. A rule may name container ports ("http") instead of numbers;
// the engine resolves them from the named ports of the pods it is told
// about, per pod, through SetNamedPorts:
//
//   - an ingress rule resolves against the selected local identity's own
//     pods on this node;
//   - an egress rule resolves against the peer identity's pods (local and
//     remote, whichever sources feed them);
//   - an egress rule whose peer is not a pod identity (every peer, or an
//     ipBlock) resolves against every pod the engine knows.
//
// The policy map is keyed by identity, not by endpoint, so where pods of
// one identity number a name differently the rule allows the union of their
// numbers for all of them (an over-approximation; pods of one label set
// normally come from one template and agree). A name no pod defines
// resolves to nothing: the rule allows nothing through it (fail closed).
//
// Cost: a pod's ports changing re-resolves only the active rules that name
// one of its port names, for the identities whose resolution changed.

// NamedPort is one named container port of a pod.
type NamedPort struct {
	Name     string `json:"name"`
	Protocol uint8  `json:"protocol"` // ProtoTCP, ProtoUDP or ProtoSCTP
	Port     uint16 `json:"port"`
}

// PodPorts are the named ports of one pod, as fed to SetNamedPorts.
type PodPorts struct {
	// Key names the pod uniquely among all feeders, e.g.
	// "local/<endpoint key>" or "node/<node>/<namespace>/<pod>".
	Key string
	// ID is the pod's identity.
	ID identity.ID
	// Local is set for pods on this node: only they resolve ingress rules.
	Local bool
	Ports []NamedPort
}

type portNumber struct {
	proto uint8
	port  uint16
}

// portTable counts, per port name, the pods defining each number.
type portTable map[string]map[portNumber]int

func (t portTable) add(p NamedPort, delta int) {
	nums := t[p.Name]
	if nums == nil {
		nums = map[portNumber]int{}
		t[p.Name] = nums
	}
	n := portNumber{p.Protocol, p.Port}
	if nums[n] += delta; nums[n] <= 0 {
		delete(nums, n)
		if len(nums) == 0 {
			delete(t, p.Name)
		}
	}
}

// namedPortState is the engine's named-port input and index.
type namedPortState struct {
	pods map[string]PodPorts
	// local: ports of this node's pods by identity; peer: of all pods by
	// identity; all: of all pods.
	local, peer map[identity.ID]portTable
	all         portTable
	// users are the active peers whose rule names each port name.
	users map[string]map[*peerState]struct{}
}

func newNamedPortState() namedPortState {
	return namedPortState{pods: map[string]PodPorts{}, local: map[identity.ID]portTable{},
		peer: map[identity.ID]portTable{}, all: portTable{}, users: map[string]map[*peerState]struct{}{}}
}

func (s *namedPortState) apply(p PodPorts, delta int) {
	for _, np := range p.Ports {
		if p.Local {
			tableOf(s.local, p.ID).add(np, delta)
		}
		tableOf(s.peer, p.ID).add(np, delta)
		s.all.add(np, delta)
	}
	for _, m := range []map[identity.ID]portTable{s.local, s.peer} {
		if t, ok := m[p.ID]; ok && len(t) == 0 {
			delete(m, p.ID)
		}
	}
}

func tableOf(m map[identity.ID]portTable, id identity.ID) portTable {
	t := m[id]
	if t == nil {
		t = portTable{}
		m[id] = t
	}
	return t
}

func (s *namedPortState) use(q *peerState, delta int) {
	for _, np := range q.rule.NamedPorts {
		users := s.users[np.Name]
		if delta > 0 {
			if users == nil {
				users = map[*peerState]struct{}{}
				s.users[np.Name] = users
			}
			users[q] = struct{}{}
			continue
		}
		delete(users, q)
		if len(users) == 0 {
			delete(s.users, np.Name)
		}
	}
}

// isPodIdentity tells pod identities (whose ports are known per identity)
// from the wildcard, reserved and CIDR identities.
func isPodIdentity(id identity.ID) bool { return id >= identity.FirstPod && !id.IsCIDR() }

// namedRanges resolves the named ports of q's rule for the pair (local,
// remote): sorted and without duplicates, so equal inputs give equal output.
func (e *Engine) namedRanges(local identity.ID, q *peerState, remote identity.ID) []policyir.PortRange {
	var t portTable
	switch {
	case q.rule.Direction == Ingress:
		t = e.named.local[local]
	case isPodIdentity(remote):
		t = e.named.peer[remote]
	default:
		t = e.named.all
	}
	var out []policyir.PortRange
	for _, np := range q.rule.NamedPorts {
		for n := range t[np.Name] {
			if np.Protocol == ProtoAny || np.Protocol == n.proto {
				out = append(out, policyir.PortRange{Protocol: n.proto, First: n.port, Last: n.port})
			}
		}
	}
	slices.SortFunc(out, func(a, b policyir.PortRange) int {
		return cmp.Or(cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.First, b.First))
	})
	return slices.Compact(out)
}

// SetNamedPorts records (or replaces) the named ports of one pod. Rules
// naming one of its old or new port names are re-resolved where their
// resolution changed. Ports with an empty name are ignored.
func (e *Engine) SetNamedPorts(p PodPorts) {
	p.Ports = slices.DeleteFunc(slices.Clone(p.Ports), func(np NamedPort) bool { return np.Name == "" })
	old, had := e.named.pods[p.Key]
	if had && old.ID == p.ID && old.Local == p.Local && slices.Equal(old.Ports, p.Ports) {
		return
	}
	e.changeNamedPorts(old, had, p, true)
}

// NamedPortPods returns every pod's named ports as last set, for a
// one-shot Compile that must resolve names as the engine does.
func (e *Engine) NamedPortPods() []PodPorts {
	out := make([]PodPorts, 0, len(e.named.pods))
	for _, p := range e.named.pods {
		out = append(out, p)
	}
	return out
}

// RemoveNamedPorts forgets the named ports of pod key.
func (e *Engine) RemoveNamedPorts(key string) {
	if old, had := e.named.pods[key]; had {
		e.changeNamedPorts(old, true, PodPorts{Key: key}, false)
	}
}

type namedUse struct {
	local, remote identity.ID
	q             *peerState
}

func (e *Engine) changeNamedPorts(old PodPorts, had bool, next PodPorts, set bool) {
	// Every linked (local, rule, remote) whose resolution may change.
	affected := map[namedUse][]policyir.PortRange{}
	var pods []PodPorts
	if had {
		pods = append(pods, old)
	}
	if set {
		pods = append(pods, next)
	}
	for _, pod := range pods {
		for _, np := range pod.Ports {
			for q := range e.named.users[np.Name] {
				e.namedUsesOf(q, pod, affected)
			}
		}
	}
	for u := range affected {
		affected[u] = e.namedRanges(u.local, u.q, u.remote)
	}
	if had {
		e.named.apply(old, -1)
		delete(e.named.pods, old.Key)
	}
	if set {
		e.named.apply(next, 1)
		e.named.pods[next.Key] = next
	}
	for u, before := range affected {
		after := e.namedRanges(u.local, u.q, u.remote)
		if slices.Equal(before, after) {
			continue
		}
		base := linkBase(u.local, u.q, u.remote)
		e.linkRanges(base, before, -1)
		e.linkRanges(base, after, 1)
	}
}

// namedUsesOf adds the pairs linked through q whose resolution reads
// pod's ports.
func (e *Engine) namedUsesOf(q *peerState, pod PodPorts, out map[namedUse][]policyir.PortRange) {
	if q.rule.Direction == Ingress {
		if !pod.Local {
			return
		}
		if _, ok := q.pol.selected[pod.ID]; !ok {
			return
		}
		for r := range q.matched {
			out[namedUse{pod.ID, r, q}] = nil
		}
		return
	}
	if q.peer == nil || q.peer.Block != nil || q.peer.NodeSelector != nil {
		// Every remote of q is a wildcard or CIDR identity.
		for r := range q.matched {
			for l := range q.pol.selected {
				out[namedUse{l, r, q}] = nil
			}
		}
		return
	}
	if _, ok := q.matched[pod.ID]; ok {
		for l := range q.pol.selected {
			out[namedUse{l, pod.ID, q}] = nil
		}
	}
}
