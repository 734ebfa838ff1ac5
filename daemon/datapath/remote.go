package datapath

import (
	"fmt"
	"net/netip"

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
	// onLocalChange is told when local endpoints or their identities
	// change (this node's NodeEndpoints publisher).
	onLocalChange func()
}

// identity resolves a remote pod address.
func (r *remoteAddrs) identity(a netip.Addr) (identity.ID, bool) {
	id, ok := r.pods[a]
	return id, ok
}

// markRemote queues every remote address (full flush after a restart).
func (d *Datapath) markRemote() {
	for a := range d.remote.pods {
		d.dirty.ips[netip.PrefixFrom(a, a.BitLen())] = struct{}{}
	}
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
	if d.remote.pods == nil {
		d.remote.pods = map[netip.Addr]identity.ID{}
	}
	for _, a := range remove {
		a = a.Unmap()
		if _, ok := d.remote.pods[a]; ok {
			delete(d.remote.pods, a)
			d.dirty.ips[netip.PrefixFrom(a, a.BitLen())] = struct{}{}
		}
	}
	for a, id := range upsert {
		a = a.Unmap()
		if d.remote.pods[a] != id {
			d.remote.pods[a] = id
			d.dirty.ips[netip.PrefixFrom(a, a.BitLen())] = struct{}{}
		}
	}
	return d.remoteChanged()
}

// RemoteEndpoints returns how many remote pod addresses are known.
func (d *Datapath) RemoteEndpoints() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.remote.pods)
}

func (d *Datapath) remoteChanged() error {
	if !d.synced {
		return nil
	}
	if err := d.flush(); err != nil {
		return fmt.Errorf("datapath: apply remote addresses: %w", err)
	}
	return nil
}

// SetLocalChangeHook installs f, called whenever an endpoint is attached,
// moved to another identity or detached. It runs under the datapath's lock:
// it must only signal, never block or call back.
func (d *Datapath) SetLocalChangeHook(f func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.remote.onLocalChange = f
}

// LocalIdentities returns the identity each attached endpoint holds, by
// endpoint key.
func (d *Datapath) LocalIdentities() map[string]identity.ID {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]identity.ID, len(d.eps))
	for k, r := range d.eps {
		out[k] = r.Identity
	}
	return out
}
