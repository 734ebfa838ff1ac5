package datapath

import (
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// endpoints is the table of this node's endpoints: their records (pinned in
// the state map, state.go), the source addresses each may send from
// (cdo_ep_addrs, addrs.go) and the named ports of their pods. It keeps the
// bookkeeping of an endpoint coming and going in order: identity, sources,
// record, policy engine, map writer, host routing. Callers hold the
// datapath's lock.
type endpoints struct {
	byKey map[string]*record
	// podPorts are the named ports of this node's pods, by "namespace/name".
	podPorts map[string][]policy.NamedPort
	state    *ebpf.Map // the records' pinned copies
	addrs    *ebpf.Map // cdo_ep_addrs
	ids      identity.Assigner
	engine   *policy.Engine
	health   *mapHealth
	log      *zap.Logger
	// The parts an endpoint's entries are spread over.
	mw  *mapWriter
	hr  *hostRouting
	att *attacher
	ct  *conntrack
	// flush writes what the map writer has pending (Datapath.flush).
	flush func() error
	// onLocalChange is told when endpoints or their identities change
	// (this node's NodeEndpoints publisher).
	onLocalChange func()
}

// get returns the endpoint recorded under key, or nil.
func (e *endpoints) get(key string) *record { return e.byKey[key] }

// all yields every endpoint, in no order.
func (e *endpoints) all() iter.Seq[*record] { return maps.Values(e.byKey) }

// count is the number of endpoints.
func (e *endpoints) count() int { return len(e.byKey) }

// sorted returns the endpoints ordered by key.
func (e *endpoints) sorted() []*record {
	out := make([]*record, 0, len(e.byKey))
	for _, k := range slices.Sorted(maps.Keys(e.byKey)) {
		out = append(out, e.byKey[k])
	}
	return out
}

// set records r under its key and publishes the change.
func (e *endpoints) set(r *record) {
	e.byKey[r.Key] = r
	e.changed()
}

// drop removes r's key and publishes the change.
func (e *endpoints) drop(r *record) {
	delete(e.byKey, r.Key)
	e.changed()
}

// changed publishes a new ifindex→key snapshot and tells the hook.
func (e *endpoints) changed() {
	e.att.publish(e.byKey)
	if e.onLocalChange != nil {
		e.onLocalChange()
	}
}

// localAddrs is the set of the endpoints' addresses.
func (e *endpoints) localAddrs() map[netip.Addr]bool {
	local := map[netip.Addr]bool{}
	for _, r := range e.byKey {
		for _, ip := range r.IPs {
			local[ip] = true
		}
	}
	return local
}

// usage reports the fill of the source address and state maps.
func (e *endpoints) usage() []MapUsage {
	addrs := 0
	for _, r := range e.byKey {
		addrs += len(r.IPs)
	}
	return []MapUsage{
		{Name: bpf.CoordinoMapCdoEpAddrs, Entries: addrs, Capacity: int(e.addrs.MaxEntries())},
		{Name: stateMapName, Entries: len(e.byKey), Capacity: maxEndpoints},
	}
}

// identities lists the endpoints' identities, ordered by number.
func (e *endpoints) identities() []identity.Identity {
	byID := map[identity.ID]identity.Identity{}
	for _, r := range e.byKey {
		byID[r.Identity] = identity.Identity{ID: r.Identity, Namespace: r.Namespace, Labels: maps.Clone(r.Labels)}
	}
	out := make([]identity.Identity, 0, len(byID))
	for _, id := range slices.Sorted(maps.Keys(byID)) {
		out = append(out, byID[id])
	}
	return out
}

// adopt takes over the endpoints pinned by a previous daemon: their
// identities, named ports and sources, and re-attaches their programs. It
// returns how many it found.
func (e *endpoints) adopt() (int, error) {
	recs, err := loadRecords(e.state)
	if err != nil {
		return 0, err
	}
	for _, r := range recs {
		id := identity.Identity{ID: r.Identity, Namespace: r.Namespace, Labels: r.Labels}
		if err := e.ids.Restore(id); err != nil {
			return 0, fmt.Errorf("datapath: adopt endpoint %q: %w", r.Key, err)
		}
		e.engine.AddLocal(id)
		feedNamedPorts(e.engine, r)
		e.set(r)
		// Adopted from a version without source validation, or a lost map.
		// Failing here only leaves this pod's traffic dropped (fail closed).
		if err := e.writeAddrs(r, nil); err != nil {
			e.log.Warn("adopted endpoint's source addresses not written", zap.String("endpoint", r.Key), zap.Error(err))
		}
		if err := e.att.attach(r); err != nil {
			// The interface may be gone; the owner's reconciliation detaches it.
			e.log.Warn("adopted endpoint not re-attached", zap.String("endpoint", r.Key), zap.Error(err))
		}
	}
	return len(recs), nil
}

// prepare records r and writes its map entries, so the programs attached
// next enforce policy on the first packet.
func (e *endpoints) prepare(r *record) error {
	old := e.byKey[r.Key]
	if old != nil && old.HostIfIndex != r.HostIfIndex {
		// Same key on a new interface: drop the old attachment first.
		if err := e.hr.deleteLocalEp(old); err != nil {
			return err
		}
		if err := e.att.detach(old); err != nil {
			return err
		}
		gone := slices.DeleteFunc(slices.Clone(old.IPs), func(ip netip.Addr) bool { return slices.Contains(r.IPs, ip) })
		if err := e.ct.queue(uint32(old.HostIfIndex), gone); err != nil {
			e.log.Warn("flows of the replaced interface left to expire", zap.String("endpoint", r.Key), zap.Error(err))
		}
	}
	id, _, err := e.ids.Acquire(r.Namespace, r.Labels)
	if err != nil {
		return fmt.Errorf("endpoint %q: %w", r.Key, err)
	}
	r.Identity = id.ID
	// The mode is recorded with the rest, before the attach, so a crash
	// mid-attach leaves a record that says which hooks to clear.
	r.Mode = e.att.newMode()
	if old != nil {
		r.Mode = old.Mode
		if r.PodMAC == "" && old.HostIfIndex == r.HostIfIndex {
			r.HostMAC, r.PodMAC = old.HostMAC, old.PodMAC
		}
	}
	e.adoptPodPorts(r, old)
	// Sources first: programs attached next drop anything else it sends.
	if err := e.writeAddrs(r, old); err != nil {
		e.ids.Release(r.Identity)
		return err
	}
	// Record first: a crash after attaching still finds the endpoint.
	if err := putRecord(e.state, r); err != nil {
		e.ids.Release(r.Identity)
		_ = e.deleteAddrs(r, old) // those the old attachment still uses stay
		return err
	}
	// Only the new identity's rules are expanded here, never the policy set.
	e.engine.AddLocal(id)
	feedNamedPorts(e.engine, r) // replaces the old attachment's (same key)
	if old != nil {
		// Same key again (e.g. moving to its cluster identity): the new
		// identity's entries go in before the old one's come out.
		e.engine.RemoveLocal(old.Identity)
		e.ids.Release(old.Identity)
		e.mw.markEndpoint(old)
		if err := e.deleteAddrs(old, r); err != nil {
			e.log.Warn("stale source addresses left", zap.String("endpoint", r.Key), zap.Error(err))
		}
	}
	e.set(r)
	e.mw.markEndpoint(r)
	if err := e.flush(); err != nil {
		if e.mw.endpointPending(r) {
			e.forget(r)
			return fmt.Errorf("endpoint %q: %w", r.Key, err)
		}
		// This endpoint is fully in the maps; other entries are retried.
		e.log.Warn("policy maps not fully updated", zap.Error(err))
	}
	return nil
}

// attached finishes r's attach: its record keeps the mode the attach
// ended with, and host routing, last, runs the policy the steps before put
// in place.
func (e *endpoints) attached(r *record, recordedMode string) error {
	if r.Mode != recordedMode { // tcx fell back to tc
		if err := putRecord(e.state, r); err != nil {
			return err
		}
	}
	if err := e.hr.writeLocalEp(r); err != nil {
		e.log.Warn("endpoint not host-routed; its traffic takes the normal path", zap.String("endpoint", r.Key), zap.Error(err))
	}
	return nil
}

// forget undoes the bookkeeping of a failed attach.
func (e *endpoints) forget(r *record) {
	if err := e.hr.deleteLocalEp(r); err != nil {
		e.log.Warn("host routing entries left after failed attach", zap.String("endpoint", r.Key), zap.Error(err))
	}
	if err := e.deleteAddrs(r, nil); err != nil {
		e.log.Warn("source addresses left after failed attach", zap.String("endpoint", r.Key), zap.Error(err))
	}
	e.drop(r)
	_ = deleteRecord(e.state, r.Key)
	e.engine.RemoveNamedPorts(localPortsKey(r))
	e.engine.RemoveLocal(r.Identity)
	e.ids.Release(r.Identity)
	e.mw.markEndpoint(r)
	if err := e.flush(); err != nil {
		e.log.Warn("resync after failed attach", zap.String("endpoint", r.Key), zap.Error(err))
	}
}

// remove drops r's map entries and state once its programs are gone;
// synced says whether the first policy snapshot was applied.
func (e *endpoints) remove(r *record, synced bool) error {
	e.drop(r)
	e.engine.RemoveNamedPorts(localPortsKey(r))
	e.engine.RemoveLocal(r.Identity)
	e.ids.Release(r.Identity)
	if err := e.deleteAddrs(r, nil); err != nil {
		return err
	}
	if err := deleteRecord(e.state, r.Key); err != nil {
		return err
	}
	if !synced {
		// No policy yet: only the detached endpoint's entries go.
		return e.mw.syncEndpointsOnly(e)
	}
	e.mw.markEndpoint(r)
	if err := e.flush(); err != nil {
		if e.mw.endpointPending(r) {
			return err
		}
		e.log.Warn("policy maps not fully updated", zap.Error(err))
	}
	return nil
}

// setPodPorts records pod's named ports and gives them to its endpoints.
func (e *endpoints) setPodPorts(pod string, ports []policy.NamedPort) {
	if len(ports) == 0 {
		delete(e.podPorts, pod)
	} else {
		e.podPorts[pod] = slices.Clone(ports)
	}
	for _, r := range e.byKey {
		if r.Pod != pod || slices.Equal(r.NamedPorts, ports) {
			continue
		}
		r.NamedPorts = slices.Clone(ports)
		feedNamedPorts(e.engine, r)
		if err := putRecord(e.state, r); err != nil {
			e.log.Warn("named ports not saved in the endpoint's state", zap.String("endpoint", r.Key), zap.Error(err))
		}
	}
}

// adoptPodPorts gives a new endpoint record its pod's ports: those last
// set, else those of the attachment it replaces (a daemon restarted
// re-attaches before its source has fed the ports again).
func (e *endpoints) adoptPodPorts(r, old *record) {
	if r.Pod == "" {
		return
	}
	if ports, ok := e.podPorts[r.Pod]; ok {
		r.NamedPorts = slices.Clone(ports)
	} else if old != nil && old.Pod == r.Pod {
		r.NamedPorts = slices.Clone(old.NamedPorts)
	}
}
