package policy

import (
	"errors"
	"maps"
	"slices"

	"github.com/coordino/coordino/api/policyir"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// SnapshotState is what the last UpdatePolicy applied; it lets the next one
// find the changed objects. Guarded by Datapath.snapMu, not mu: diffing and
// normalizing a large snapshot happen without blocking endpoint attaches.
type SnapshotState struct {
	Policies   map[string]Object // valid ones, by namespace/name
	Invalid    map[string]error
	Namespaces map[string]*corev1.Namespace
	// Nodes are the labels and addresses of the last snapshot's nodes.
	Nodes map[string]*nodeState
}

// SnapshotDelta is a snapshot's difference to the last one, normalized.
type SnapshotDelta struct {
	namespaces map[string]map[string]string // nil value: gone
	nodes      map[string]*nodeState        // nil value: gone
	deleted    []string                     // namespace/name
	upserted   []*policyir.Policy
}

// Diff compares s with the last applied snapshot and normalizes what
// changed. Cost: one comparison per object (pointer equality first: the
// standalone source hands over unchanged files' objects as they were) plus
// normalizing the changed ones.
func (st *SnapshotState) Diff(s Snapshot) (*SnapshotDelta, error) {
	delta := &SnapshotDelta{namespaces: map[string]map[string]string{}}
	nextNS := map[string]*corev1.Namespace{}
	for _, ns := range s.Namespaces {
		if _, dup := nextNS[ns.Name]; dup {
			continue
		}
		nextNS[ns.Name] = ns
		old := st.Namespaces[ns.Name]
		if old == nil || !maps.Equal(old.Labels, ns.Labels) {
			delta.namespaces[ns.Name] = ns.Labels
			if delta.namespaces[ns.Name] == nil {
				delta.namespaces[ns.Name] = map[string]string{}
			}
		}
	}
	for name := range st.Namespaces {
		if _, ok := nextNS[name]; !ok {
			delta.namespaces[name] = nil
		}
	}
	st.Namespaces = nextNS
	delta.nodes, st.Nodes = diffNodes(st.Nodes, s.Nodes)

	next := map[string]Object{}
	invalid := map[string]error{}
	for _, o := range s.Objects() {
		key := o.Key
		if _, dup := next[key]; dup {
			continue
		}
		if _, dup := invalid[key]; dup {
			continue
		}
		old, had := st.Policies[key]
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
	for key := range st.Policies {
		if _, ok := next[key]; !ok {
			if _, bad := invalid[key]; !bad {
				delta.deleted = append(delta.deleted, key)
			}
		}
	}
	st.Policies, st.Invalid = next, invalid
	if len(invalid) == 0 {
		return delta, nil
	}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(invalid)) {
		errs = append(errs, invalid[k])
	}
	return delta, errors.Join(errs...)
}

// Feed gives the delta to the engine.
func (delta *SnapshotDelta) Feed(e *Engine) {
	for _, name := range slices.Sorted(maps.Keys(delta.namespaces)) {
		e.SetNamespace(name, delta.namespaces[name])
	}
	for _, name := range slices.Sorted(maps.Keys(delta.nodes)) {
		if n := delta.nodes[name]; n != nil {
			e.SetNode(name, n.labels, n.addrs)
		} else {
			e.DeleteNode(name)
		}
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

// diffNodes returns the nodes of next whose labels or addresses differ
// from last, and those gone (nil), with next's state.
func diffNodes(last map[string]*nodeState, next []*corev1.Node) (changed, state map[string]*nodeState) {
	changed, state = map[string]*nodeState{}, map[string]*nodeState{}
	for _, n := range next {
		if _, dup := state[n.Name]; dup {
			continue
		}
		ns := &nodeState{labels: labels.Set(n.Labels), addrs: normalAddrs(NodeAddrs(n))}
		state[n.Name] = ns
		if old := last[n.Name]; old == nil || !maps.Equal(old.labels, ns.labels) || !slices.Equal(old.addrs, ns.addrs) {
			changed[n.Name] = ns
		}
	}
	for name := range last {
		if _, ok := state[name]; !ok {
			changed[name] = nil
		}
	}
	return changed, state
}
