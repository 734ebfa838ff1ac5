package identity

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
)

// ID is a numeric security identity as stored in the BPF maps.
type ID uint32

// Reserved identities; the values match bpf/coordino.h.
const (
	// Any is the wildcard remote identity of a policy entry; never assigned.
	Any ID = 0
	// Host is the node the endpoint runs on.
	Host ID = 1
	// World is any address the ipcache does not know.
	World ID = 2
	// FirstPod is the lowest identity handed out for a label set.
	FirstPod ID = 256
	// LastCluster is the highest cluster-wide identity (coordino.io Identity
	// objects number [FirstPod, LastCluster]).
	LastCluster ID = 0x7FFFFF
	// FirstNodeLocal and LastNodeLocal bound the temporary identities a
	// daemon assigns to a label set before its cluster Identity exists.
	FirstNodeLocal ID = 0x800000
	LastNodeLocal  ID = 0xFFFFFF
	// CIDRFlag marks node-local identities of ipBlock prefixes.
	CIDRFlag ID = 0x01000000
	// maxCIDR bounds CIDR identities.
	maxCIDR ID = 0x01ffffff
)

// IsCIDR reports whether id is a CIDR identity.
func (id ID) IsCIDR() bool { return id&CIDRFlag != 0 && id <= maxCIDR }

// String names reserved identities and prints others as numbers.
func (id ID) String() string {
	switch id {
	case Any:
		return "any"
	case Host:
		return "host"
	case World:
		return "world"
	}
	if id.IsCIDR() {
		return fmt.Sprintf("cidr:%d", uint32(id&^CIDRFlag))
	}
	return fmt.Sprintf("%d", uint32(id))
}

// Identity is a pod identity and the label set it stands for.
type Identity struct {
	ID        ID
	Namespace string
	Labels    map[string]string
}

// Key returns the canonical string of a (namespace, labels) set: equal sets
// give equal keys whatever the map order.
func Key(namespace string, labels map[string]string) string {
	var b strings.Builder
	b.WriteString(namespace)
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		// NUL cannot occur in namespaces or label keys/values.
		fmt.Fprintf(&b, "\x00%s=%s", k, labels[k])
	}
	return b.String()
}

type entry struct {
	Identity
	refs int
}

// Assigner gives endpoints their identity; it is the seam between the
// datapath and where identities come from. Standalone, *Allocator numbers
// label sets on the node. In Kubernetes mode an implementation returns the
// cluster Identity of the label set, or a temporary one in
// [FirstNodeLocal, LastNodeLocal] until that exists; the endpoint moves to
// the cluster identity when its owner attaches it again
// (datapath.AttachEndpoint with the same key and interface).
//
// The datapath calls Acquire once per attached endpoint and Release once
// per detached one, and Restore for endpoints adopted after a restart.
type Assigner interface {
	// Acquire returns the identity for (namespace, labels) and takes a
	// reference; created reports that the number is new.
	Acquire(namespace string, labels map[string]string) (id Identity, created bool, err error)
	// Release drops a reference and reports whether the identity is gone.
	Release(id ID) bool
	// Restore takes a reference to an identity found in pinned state.
	Restore(id Identity) error
}

// Allocator hands out pod identities and counts their references (one per
// endpoint). It is safe for concurrent use.
type Allocator struct {
	mu          sync.Mutex
	byKey       map[string]*entry
	byID        map[ID]*entry
	next        ID
	first, last ID
}

// NewAllocator returns an empty allocator of node-wide identities
// (standalone mode: the whole pod range).
func NewAllocator() *Allocator { return NewRangeAllocator(FirstPod, CIDRFlag-1) }

// NewRangeAllocator returns an allocator handing out numbers in
// [first, last] only, e.g. [FirstNodeLocal, LastNodeLocal] for temporary
// identities in Kubernetes mode.
func NewRangeAllocator(first, last ID) *Allocator {
	return &Allocator{byKey: map[string]*entry{}, byID: map[ID]*entry{}, next: first, first: first, last: last}
}

// Acquire returns the identity of (namespace, labels), allocating one when
// the set is new, and takes a reference. created reports a new allocation.
func (a *Allocator) Acquire(namespace string, labels map[string]string) (id Identity, created bool, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := Key(namespace, labels)
	if e, ok := a.byKey[k]; ok {
		e.refs++
		return e.Identity, false, nil
	}
	n, err := a.free()
	if err != nil {
		return Identity{}, false, err
	}
	e := &entry{Identity: Identity{ID: n, Namespace: namespace, Labels: maps.Clone(labels)}, refs: 1}
	a.byKey[k], a.byID[n] = e, e
	return e.Identity, true, nil
}

// Restore re-registers an identity found in pinned state after a restart and
// takes a reference, so the same label set keeps the same number.
func (a *Allocator) Restore(id Identity) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if id.ID < a.first || id.ID > a.last {
		return fmt.Errorf("restore identity %d: not in this allocator's range %d-%d", id.ID, a.first, a.last)
	}
	k := Key(id.Namespace, id.Labels)
	if e, ok := a.byKey[k]; ok {
		if e.ID != id.ID {
			return fmt.Errorf("restore identity %d: label set already has identity %d", id.ID, e.ID)
		}
		e.refs++
		return nil
	}
	if _, ok := a.byID[id.ID]; ok {
		return fmt.Errorf("restore identity %d: number already used by another label set", id.ID)
	}
	e := &entry{Identity: Identity{ID: id.ID, Namespace: id.Namespace, Labels: maps.Clone(id.Labels)}, refs: 1}
	a.byKey[k], a.byID[id.ID] = e, e
	return nil
}

// Release drops a reference to id and reports whether the identity is gone.
func (a *Allocator) Release(id ID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.byID[id]
	if !ok {
		return false
	}
	if e.refs--; e.refs > 0 {
		return false
	}
	delete(a.byID, id)
	delete(a.byKey, Key(e.Namespace, e.Labels))
	return true
}

// Get returns the identity with number id.
func (a *Allocator) Get(id ID) (Identity, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.byID[id]
	if !ok {
		return Identity{}, false
	}
	return e.Identity, true
}

// All returns every live identity ordered by number.
func (a *Allocator) All() []Identity {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Identity, 0, len(a.byID))
	for _, id := range slices.Sorted(maps.Keys(a.byID)) {
		out = append(out, a.byID[id].Identity)
	}
	return out
}

// free finds the next unused pod identity, wrapping around once.
func (a *Allocator) free() (ID, error) {
	for range a.last - a.first + 1 {
		n := a.next
		if a.next++; a.next > a.last {
			a.next = a.first
		}
		if _, used := a.byID[n]; !used {
			return n, nil
		}
	}
	return 0, fmt.Errorf("allocate identity: all %d identities in use", a.last-a.first+1)
}
