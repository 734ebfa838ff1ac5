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
	// CIDRFlag marks node-local identities of ipBlock prefixes.
	CIDRFlag ID = 0x01000000
	// maxPod bounds pod identities below the CIDR range.
	maxPod ID = CIDRFlag - 1
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

// Allocator hands out pod identities and counts their references (one per
// endpoint). It is safe for concurrent use.
type Allocator struct {
	mu    sync.Mutex
	byKey map[string]*entry
	byID  map[ID]*entry
	next  ID
}

// NewAllocator returns an empty allocator.
func NewAllocator() *Allocator {
	return &Allocator{byKey: map[string]*entry{}, byID: map[ID]*entry{}, next: FirstPod}
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
	if id.ID < FirstPod || id.ID > maxPod {
		return fmt.Errorf("restore identity %d: not a pod identity", id.ID)
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
	for range maxPod - FirstPod + 1 {
		n := a.next
		if a.next++; a.next > maxPod {
			a.next = FirstPod
		}
		if _, used := a.byID[n]; !used {
			return n, nil
		}
	}
	return 0, fmt.Errorf("allocate identity: all %d pod identities in use", maxPod-FirstPod+1)
}
