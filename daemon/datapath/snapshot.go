package datapath

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
	corev1 "k8s.io/api/core/v1"
)

// snapshotState is what the last UpdatePolicy applied; it lets the next one
// find the changed objects. Guarded by Datapath.snapMu, not mu: diffing and
// normalizing a large snapshot happen without blocking endpoint attaches.
type snapshotState struct {
	policies   map[string]policy.Object // valid ones, by namespace/name
	invalid    map[string]error
	namespaces map[string]*corev1.Namespace
}

// snapshotDelta is a snapshot's difference to the last one, normalized.
type snapshotDelta struct {
	namespaces map[string]map[string]string // nil value: gone
	deleted    []string                     // namespace/name
	upserted   []*policyir.Policy
}

// diff compares s with the last applied snapshot and normalizes what
// changed. Cost: one comparison per object (pointer equality first: the
// standalone source hands over unchanged files' objects as they were) plus
// normalizing the changed ones.
func (st *snapshotState) diff(s policy.Snapshot) (*snapshotDelta, error) {
	delta := &snapshotDelta{namespaces: map[string]map[string]string{}}
	nextNS := map[string]*corev1.Namespace{}
	for _, ns := range s.Namespaces {
		if _, dup := nextNS[ns.Name]; dup {
			continue
		}
		nextNS[ns.Name] = ns
		old := st.namespaces[ns.Name]
		if old == nil || !maps.Equal(old.Labels, ns.Labels) {
			delta.namespaces[ns.Name] = ns.Labels
			if delta.namespaces[ns.Name] == nil {
				delta.namespaces[ns.Name] = map[string]string{}
			}
		}
	}
	for name := range st.namespaces {
		if _, ok := nextNS[name]; !ok {
			delta.namespaces[name] = nil
		}
	}
	st.namespaces = nextNS

	next := map[string]policy.Object{}
	invalid := map[string]error{}
	for _, o := range s.Objects() {
		key := o.Key
		if _, dup := next[key]; dup {
			continue
		}
		if _, dup := invalid[key]; dup {
			continue
		}
		old, had := st.policies[key]
		if had && old.Same(o) {
			next[key] = old
			continue
		}
		p, err := o.Normalize()
		if err != nil {
			invalid[key] = err
			if had {
				delta.deleted = append(delta.deleted, key)
			}
			continue
		}
		next[key] = o
		delta.upserted = append(delta.upserted, p)
	}
	for key := range st.policies {
		if _, ok := next[key]; !ok {
			if _, bad := invalid[key]; !bad {
				delta.deleted = append(delta.deleted, key)
			}
		}
	}
	st.policies, st.invalid = next, invalid
	if len(invalid) == 0 {
		return delta, nil
	}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(invalid)) {
		errs = append(errs, invalid[k])
	}
	return delta, errors.Join(errs...)
}

// feed gives the delta to the engine; callers hold mu.
func (delta *snapshotDelta) feed(e *policy.Engine) {
	for _, name := range slices.Sorted(maps.Keys(delta.namespaces)) {
		e.SetNamespace(name, delta.namespaces[name])
	}
	for _, key := range delta.deleted {
		ns, name := splitKey(key)
		e.DeletePolicy(ns, name)
	}
	for _, p := range delta.upserted {
		e.UpsertPolicy(p)
	}
}

func splitKey(key string) (ns, name string) {
	for i := range len(key) {
		if key[i] == '/' {
			return key[:i], key[i+1:]
		}
	}
	return "", key
}

// UpdatePolicy replaces the policy snapshot: the objects that changed since
// the last call are normalized, fed to the policy engine, and the resulting
// map differences written. Invalid policies are skipped and reported in the
// error (counted in coordino_policy_invalid); valid ones are applied
// regardless. A map write failure is reported too and retried in the
// background; what was written never allows more than the old or the new
// policy would.
func (d *Datapath) UpdatePolicy(s policy.Snapshot) error {
	d.snapMu.Lock()
	defer d.snapMu.Unlock()
	delta, invalid := d.snap.diff(s)
	d.metrics.setCompileError(invalid)
	defer d.metrics.policies.Set(float64(len(d.snap.policies)))

	d.mu.Lock()
	defer d.mu.Unlock()
	delta.feed(d.engine)
	d.synced = true // the first flush is a full one (mapWriter.markAll)
	d.iso.setPolicies(s.NodeIsolation)
	err := errors.Join(d.flush(""), d.iso.apply())
	if !d.cidrsRetained && err == nil {
		// Numbers restored from the pins that no policy uses any more.
		keep := map[netip.Prefix]bool{}
		d.engine.Prefixes(func(p netip.Prefix, _ identity.ID) { keep[p] = true })
		d.cidrs.Retain(keep)
		d.cidrsRetained = true
	}
	if err != nil {
		return fmt.Errorf("datapath: apply policy: %w", errors.Join(err, invalid))
	}
	return invalid
}
