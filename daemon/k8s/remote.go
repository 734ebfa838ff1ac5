package k8s

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// remotePorts is one remote pod's named ports under its identity.
type remotePorts struct {
	id    identity.ID
	ports []policy.NamedPort
}

// remoteEndpoints turns NodeEndpoints events into ipcache deltas. The
// informer handler only records which nodes changed (the latest object of
// each); the apply loop diffs each changed node's entries against what it
// announced for that node, so one pod starting costs the diff of its node's
// object and one ipcache write on every other node, whatever the cluster's
// size.
type remoteEndpoints struct {
	self string
	log  *zap.Logger

	mu      sync.Mutex
	pending map[string]*coordinov1alpha1.NodeEndpoints // nil: deleted

	// Touched by the apply loop only.
	byNode map[string]map[netip.Addr]identity.ID
	// owner is the node an address was last announced for: a pod address
	// reused on another node before the old node's object caught up is not
	// withdrawn by that late update.
	owner map[netip.Addr]string
	// portsByNode are the named ports announced per node, by pod key.
	portsByNode map[string]map[string]remotePorts
}

func newRemoteEndpoints(self string, log *zap.Logger) *remoteEndpoints {
	return &remoteEndpoints{self: self, log: log, pending: map[string]*coordinov1alpha1.NodeEndpoints{},
		byNode: map[string]map[netip.Addr]identity.ID{}, owner: map[netip.Addr]string{},
		portsByNode: map[string]map[string]remotePorts{}}
}

// handler records events; mark tells the apply loop.
func (r *remoteEndpoints) handler(mark func()) cache.ResourceEventHandler {
	record := func(obj any, deleted bool) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		ne, ok := obj.(*coordinov1alpha1.NodeEndpoints)
		if !ok || ne.Name == r.self {
			return
		}
		r.mu.Lock()
		if deleted {
			r.pending[ne.Name] = nil
		} else {
			r.pending[ne.Name] = ne
		}
		r.mu.Unlock()
		mark()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { record(o, false) },
		UpdateFunc: func(_, o any) { record(o, false) },
		DeleteFunc: func(o any) { record(o, true) },
	}
}

// apply sends the deltas of the nodes changed since the last call.
func (r *remoteEndpoints) apply(sink Sink) {
	r.mu.Lock()
	changed := r.pending
	r.pending = map[string]*coordinov1alpha1.NodeEndpoints{}
	r.mu.Unlock()
	if len(changed) == 0 {
		return
	}
	upsert := map[netip.Addr]identity.ID{}
	var remove []netip.Addr
	for node, ne := range changed {
		next := map[netip.Addr]identity.ID{}
		if ne != nil {
			var err error
			if next, err = remoteEntries(ne); err != nil {
				r.log.Warn("NodeEndpoints entries skipped", zap.String("node", node), zap.Error(err))
			}
		}
		prev := r.byNode[node]
		for a := range prev {
			if _, ok := next[a]; !ok && r.owner[a] == node {
				remove = append(remove, a)
				delete(r.owner, a)
			}
		}
		for a, id := range next {
			if prev[a] != id || r.owner[a] != node {
				upsert[a] = id
				r.owner[a] = node
			}
		}
		if len(next) == 0 {
			delete(r.byNode, node)
		} else {
			r.byNode[node] = next
		}
		r.applyPorts(sink, node, ne)
	}
	if len(upsert) == 0 && len(remove) == 0 {
		return
	}
	if err := sink.UpdateRemoteEndpoints(upsert, remove); err != nil {
		r.log.Error("updating remote endpoints", zap.Error(err))
	}
}

// applyPorts tells the sink the named ports of node's pods that changed;
// a pod is keyed by its node and first address.
func (r *remoteEndpoints) applyPorts(sink Sink, node string, ne *coordinov1alpha1.NodeEndpoints) {
	next := map[string]remotePorts{}
	if ne != nil {
		for _, ep := range ne.Spec.Endpoints {
			id := identity.ID(ep.Identity)
			if len(ep.NamedPorts) == 0 || len(ep.Addresses) == 0 || id < identity.FirstPod || id > identity.LastCluster {
				continue
			}
			next[node+"/"+ep.Addresses[0]] = remotePorts{id: id, ports: apiNamedPorts(ep.NamedPorts)}
		}
	}
	prev := r.portsByNode[node]
	for key := range prev {
		if _, ok := next[key]; !ok {
			if err := sink.SetPeerNamedPorts(key, 0, nil); err != nil {
				r.log.Error("forgetting a remote pod's named ports", zap.String("pod", key), zap.Error(err))
			}
		}
	}
	for key, p := range next {
		if old, ok := prev[key]; ok && old.id == p.id && slices.Equal(old.ports, p.ports) {
			continue
		}
		if err := sink.SetPeerNamedPorts(key, p.id, p.ports); err != nil {
			r.log.Error("setting a remote pod's named ports", zap.String("pod", key), zap.Error(err))
		}
	}
	if len(next) == 0 {
		delete(r.portsByNode, node)
	} else {
		r.portsByNode[node] = next
	}
}

// apiNamedPorts converts published named ports, sorted like podNamedPorts;
// the CRD schema has already bounded names, protocols and numbers.
func apiNamedPorts(in []coordinov1alpha1.NamedPort) []policy.NamedPort {
	out := make([]policy.NamedPort, 0, len(in))
	for _, np := range in {
		if np.Port < 1 || np.Port > 65535 {
			continue
		}
		out = append(out, policy.NamedPort{Name: np.Name, Protocol: protocolNumber(corev1.Protocol(np.Protocol)), Port: uint16(np.Port)})
	}
	return sortedPorts(out)
}

// count is the number of remote addresses known (apply loop only).
func (r *remoteEndpoints) count() int { return len(r.owner) }

// remoteEntries parses one node's entries; a bad entry is skipped (and
// reported) so it cannot withdraw the node's other pods.
func remoteEntries(ne *coordinov1alpha1.NodeEndpoints) (map[netip.Addr]identity.ID, error) {
	out := make(map[netip.Addr]identity.ID, len(ne.Spec.Endpoints))
	var firstErr error
	for i, ep := range ne.Spec.Endpoints {
		id := identity.ID(ep.Identity)
		if ep.Identity < 0 || id < identity.FirstPod || id > identity.LastCluster {
			if firstErr == nil {
				firstErr = fmt.Errorf("spec.endpoints[%d].identity %d: not a cluster identity", i, ep.Identity)
			}
			continue
		}
		for _, s := range ep.Addresses {
			a, err := netip.ParseAddr(s)
			if err == nil && (a.Zone() != "" || !a.IsValid() || a.IsUnspecified()) {
				err = fmt.Errorf("%q is not a pod address", s)
			}
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("spec.endpoints[%d].addresses: %w", i, err)
				}
				continue
			}
			out[a.Unmap()] = id
		}
	}
	return out, firstErr
}
