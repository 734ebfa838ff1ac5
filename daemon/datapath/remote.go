package datapath

import (
	"fmt"
	"net/netip"

	"github.com/google/btree"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/identity"
)

// Remote pod addresses. Pods on other nodes are known by address with their
// cluster identity (Kubernetes mode: the NodeEndpoints of every node). They
// only feed the ipcache: the policy engine already knows every cluster
// identity, so a remote pod's address resolving to its identity is all a
// rule selecting it by labels needs. Updates are deltas; each costs the
// ipcache writes of the addresses it names.
type remoteAddrs struct {
	pods map[netip.Addr]identity.ID
	// sorted holds the keys of pods in address order, so a new ipBlock
	// prefix visits only the addresses inside it, not every remote pod.
	sorted *btree.BTreeG[netip.Addr]
	// unconfirmed are the addresses restored from the pinned ipcache at
	// start that no remote source has confirmed yet: kept, with their
	// identities, until the source's first full view (RemoteEndpointsSynced),
	// so a restart while the API server is down cuts no cross-node flow.
	unconfirmed map[netip.Addr]struct{}
}

// identity resolves a remote pod address.
func (r *remoteAddrs) identity(a netip.Addr) (identity.ID, bool) {
	id, ok := r.pods[a]
	return id, ok
}

// set records a's identity.
func (r *remoteAddrs) set(a netip.Addr, id identity.ID) {
	if r.pods == nil {
		r.pods = map[netip.Addr]identity.ID{}
		r.sorted = btree.NewG(32, netip.Addr.Less)
	}
	if _, ok := r.pods[a]; !ok {
		r.sorted.ReplaceOrInsert(a)
	}
	r.pods[a] = id
}

// forget removes a; it reports whether a was known.
func (r *remoteAddrs) forget(a netip.Addr) bool {
	if _, ok := r.pods[a]; !ok {
		return false
	}
	delete(r.pods, a)
	delete(r.unconfirmed, a)
	r.sorted.Delete(a)
	return true
}

// inside calls f for every remote address in p, in address order; the
// cost is the tree's depth plus the addresses visited.
func (r *remoteAddrs) inside(p netip.Prefix, f func(netip.Addr)) {
	if r.sorted == nil {
		return
	}
	p = p.Masked()
	r.sorted.AscendGreaterOrEqual(p.Addr(), func(a netip.Addr) bool {
		if !p.Contains(a) {
			return false
		}
		f(a)
		return true
	})
}

// each calls f for every remote address.
func (r *remoteAddrs) each(f func(netip.Addr)) {
	for a := range r.pods {
		f(a)
	}
}

// count is the number of remote pod addresses known.
func (r *remoteAddrs) count() int { return len(r.pods) }

// unconfirmedCount is the number of addresses restored at start and not
// confirmed yet.
func (r *remoteAddrs) unconfirmedCount() int { return len(r.unconfirmed) }

// update applies a delta of the remote source, which confirms what it
// names; changed is told every address whose identity changed or went.
func (r *remoteAddrs) update(upsert map[netip.Addr]identity.ID, remove []netip.Addr, changed func(netip.Addr)) {
	for _, a := range remove {
		a = a.Unmap()
		if r.forget(a) {
			changed(a)
		}
	}
	for a, id := range upsert {
		a = a.Unmap()
		delete(r.unconfirmed, a)
		if have, ok := r.pods[a]; !ok || have != id {
			r.set(a, id)
			changed(a)
		}
	}
}

// dropUnconfirmed forgets the addresses no remote source confirmed,
// telling changed each, and returns how many.
func (r *remoteAddrs) dropUnconfirmed(changed func(netip.Addr)) int {
	n := len(r.unconfirmed)
	for a := range r.unconfirmed {
		r.forget(a) // also deletes a from unconfirmed
		changed(a)
	}
	return n
}

// adopt takes a as known but unconfirmed: restored at start from the
// pinned ipcache.
func (r *remoteAddrs) adopt(a netip.Addr, id identity.ID) {
	r.set(a, id)
	if r.unconfirmed == nil {
		r.unconfirmed = map[netip.Addr]struct{}{}
	}
	r.unconfirmed[a] = struct{}{}
}

// RemoteEndpointsSynced tells the datapath that the updates received so far
// are the remote source's whole view: restored addresses it did not
// confirm leave the ipcache.
func (d *Datapath) RemoteEndpointsSynced() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.remote.dropUnconfirmed(d.mw.markAddr)
	if n == 0 {
		return nil
	}
	d.log.Info("remote endpoints restored at start and not confirmed by the cluster removed", zap.Int("addresses", n))
	return d.flush("apply remote addresses")
}

// UpdateRemoteEndpoints sets the identity of the remote pod addresses in
// upsert and forgets those in remove. Identities must be cluster
// identities; an address of a local endpoint keeps the local identity.
// Before the first policy snapshot the change is only recorded, so the
// first flush after a restart already has it.
func (d *Datapath) UpdateRemoteEndpoints(upsert map[netip.Addr]identity.ID, remove []netip.Addr) error {
	for a, id := range upsert {
		if id < identity.FirstPod || id > identity.LastCluster {
			return fmt.Errorf("datapath: remote endpoint %s: identity %d is not a cluster identity", a, id)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.remote.update(upsert, remove, d.mw.markAddr)
	return d.flush("apply remote addresses")
}

// RemoteEndpoints returns how many remote pod addresses are known.
func (d *Datapath) RemoteEndpoints() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.remote.count()
}

// SetLocalChangeHook installs f, called whenever an endpoint is attached,
// moved to another identity or detached. It runs under the datapath's lock:
// it must only signal, never block or call back.
func (d *Datapath) SetLocalChangeHook(f func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.eps.onLocalChange = f
}

// LocalIdentities returns the identity each attached endpoint holds, by
// endpoint key.
func (d *Datapath) LocalIdentities() map[string]identity.ID {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]identity.ID, d.eps.count())
	for r := range d.eps.all() {
		out[r.Key] = r.Identity
	}
	return out
}
