package k8s

import (
	"maps"
	"sync"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/identity"
)

// Identities is the Kubernetes mode's identity.Assigner. A label set with a
// cluster Identity gets its number; one without gets a temporary node-local
// number from [identity.FirstNodeLocal, identity.LastNodeLocal] at once, so
// no ADD waits on the controller. Policy for a temporary identity is
// compiled from the same (namespace, labels) the cluster identity will
// stand for, so it never allows more. When the cluster Identity appears,
// Stale names the label sets whose endpoints should be re-attached to move
// to it.
type Identities struct {
	mu sync.Mutex
	// cluster maps a label-set hash to its cluster identity.
	cluster map[string]identity.Identity
	// hashOf is the reverse of cluster, for deletions.
	hashOf map[identity.ID]string
	// nsLabels returns a namespace's labels, false when unknown.
	nsLabels func(namespace string) (map[string]string, bool)
	temp     *identity.Allocator
	// held counts, per label set (identity.Key), the references local
	// endpoints hold on each number.
	held map[string]map[identity.ID]int
	keys map[identity.ID]string
}

var _ identity.Assigner = (*Identities)(nil)

// NewIdentities returns an assigner knowing no cluster identity yet.
// nsLabels looks up a namespace's labels (they are part of the label set).
func NewIdentities(nsLabels func(namespace string) (map[string]string, bool)) *Identities {
	return &Identities{
		cluster:  map[string]identity.Identity{},
		hashOf:   map[identity.ID]string{},
		nsLabels: nsLabels,
		temp:     identity.NewRangeAllocator(identity.FirstNodeLocal, identity.LastNodeLocal),
		held:     map[string]map[identity.ID]int{},
		keys:     map[identity.ID]string{},
	}
}

// SetCluster records a cluster identity and the hash of its label set.
func (a *Identities) SetCluster(id identity.Identity, hash string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if old, ok := a.hashOf[id.ID]; ok && old != hash {
		delete(a.cluster, old)
	}
	a.cluster[hash] = id
	a.hashOf[id.ID] = hash
}

// DeleteCluster forgets a cluster identity (garbage-collected by the
// controller, which happens only when no node uses it).
func (a *Identities) DeleteCluster(id identity.ID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if h, ok := a.hashOf[id]; ok {
		delete(a.cluster, h)
		delete(a.hashOf, id)
	}
}

// ClusterCount is the number of cluster identities known.
func (a *Identities) ClusterCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.cluster)
}

// lookup returns the cluster identity of (namespace, labels) if it exists.
// The caller holds a.mu.
func (a *Identities) lookup(namespace string, labels map[string]string) (identity.ID, bool) {
	ns, ok := a.nsLabels(namespace)
	if !ok {
		return 0, false
	}
	full := coordinov1alpha1.SecurityLabels(labels, ns, nil)
	c, ok := a.cluster[coordinov1alpha1.LabelSetHash(namespace, full)]
	if !ok || c.Namespace != namespace || !maps.Equal(c.Labels, labels) {
		return 0, false
	}
	return c.ID, true
}

// Acquire implements identity.Assigner.
func (a *Identities) Acquire(namespace string, labels map[string]string) (identity.Identity, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := identity.Key(namespace, labels)
	if n, ok := a.lookup(namespace, labels); ok {
		created := a.hold(key, n)
		return identity.Identity{ID: n, Namespace: namespace, Labels: maps.Clone(labels)}, created, nil
	}
	id, created, err := a.temp.Acquire(namespace, labels)
	if err != nil {
		return identity.Identity{}, false, err
	}
	a.hold(key, id.ID)
	return id, created, nil
}

func (a *Identities) hold(key string, n identity.ID) (first bool) {
	if a.held[key] == nil {
		a.held[key] = map[identity.ID]int{}
	}
	a.held[key][n]++
	a.keys[n] = key
	return a.held[key][n] == 1
}

// Release implements identity.Assigner.
func (a *Identities) Release(n identity.ID) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	key, ok := a.keys[n]
	if !ok {
		return false
	}
	if isTemporary(n) {
		a.temp.Release(n)
	}
	refs := a.held[key]
	if refs[n]--; refs[n] > 0 {
		return false
	}
	delete(refs, n)
	if len(refs) == 0 {
		delete(a.held, key)
	}
	delete(a.keys, n)
	return true
}

// Restore implements identity.Assigner: identities found in pinned state
// after a restart are kept as they are, cluster or temporary, so nothing is
// renumbered before the informers have synced.
func (a *Identities) Restore(id identity.Identity) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if isTemporary(id.ID) {
		if err := a.temp.Restore(id); err != nil {
			return err
		}
	}
	a.hold(identity.Key(id.Namespace, id.Labels), id.ID)
	return nil
}

// Stale reports whether endpoints of (namespace, labels) hold a number
// other than the one Acquire would give now: a temporary identity whose
// cluster Identity has appeared, or a cluster identity replaced after the
// namespace's labels changed.
func (a *Identities) Stale(namespace string, labels map[string]string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	refs := a.held[identity.Key(namespace, labels)]
	if len(refs) == 0 {
		return false
	}
	want, ok := a.lookup(namespace, labels)
	for n := range refs {
		if !ok && !isTemporary(n) {
			return true // its cluster identity is gone: move to a temporary one
		}
		if ok && n != want {
			return true
		}
	}
	return false
}

// Temporary returns how many temporary identities local endpoints hold.
func (a *Identities) Temporary() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for id := range a.keys {
		if isTemporary(id) {
			n++
		}
	}
	return n
}

func isTemporary(n identity.ID) bool {
	return n >= identity.FirstNodeLocal && n <= identity.LastNodeLocal
}
