package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
	cniv1 "github.com/coordino/coordino/proto/cni/v1"
	"github.com/coordino/coordino/proto/cni/v1/wire"
	"github.com/coordino/coordino/proto/deletequeue"
)

// unrestored tracks stored endpoints whose addresses could not be reserved
// at restore (their block changed: the address is now a network address,
// or another endpoint holds it). Their DEL must not free those addresses,
// which may belong to someone else.
type unrestored struct {
	mu   sync.Mutex
	addr map[store.Key][]netip.Prefix
}

func (u *unrestored) set(k store.Key, addrs []netip.Prefix) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.addr == nil {
		u.addr = map[store.Key][]netip.Prefix{}
	}
	u.addr[k] = addrs
}

// take forgets k and returns the addresses it could not reserve.
func (u *unrestored) take(k store.Key) []netip.Prefix {
	u.mu.Lock()
	defer u.mu.Unlock()
	a := u.addr[k]
	delete(u.addr, k)
	return a
}

func (u *unrestored) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.addr)
}

// Restore rebuilds the allocator from the store, and tells Config.Chained
// the networks of the chained attachments. Call it once, before
// serving and before DrainDeleteQueue. An endpoint whose addresses no
// longer fit the node's blocks (a pod-CIDR or block change) does not stop
// the daemon: it is logged and counted (coordino_endpoints_unrestorable),
// keeps running as it is, and its DEL or GC removes it.
func (m *Manager) Restore() error {
	eps, err := m.cfg.Store.List("")
	if err != nil {
		return err
	}
	bad := 0
	for _, ep := range eps {
		if ep.Mode == store.ModeChained {
			m.learnChained(context.Background(), ep)
			continue
		}
		if ep.Mode != store.ModePrimary {
			continue
		}
		if rejected, err := m.cfg.Pool.Reserve(ep.IPs); err != nil {
			bad++
			m.unrestored.set(ep.Key, rejected)
			m.cfg.Log.Error("stored endpoint holds addresses the node's blocks cannot reserve; it keeps running, DEL or GC removes it",
				zap.String("endpoint", ep.Key.String()), zap.String("pod", ep.PodNamespace+"/"+ep.PodName), zap.Error(err))
		}
	}
	m.cfg.Log.Info("restored endpoints", zap.Int("count", len(eps)), zap.Int("unrestorable", bad))
	return nil
}

// Queued DELs are ordered against ADDs by the key lock and the queue file
// alone, never by clocks: the runtime issues an ADD only after the DEL that
// precedes it returned, so that DEL's file exists when the ADD starts, and
// the ADD applies and removes it before creating anything. A drain therefore
// applies an entry only if its file still exists under the key's lock.
// releaseAddresses frees ep's addresses, except those it never reserved.
func (m *Manager) releaseAddresses(ep *store.Endpoint) {
	skip := m.unrestored.take(ep.Key)
	m.cfg.Pool.Release(slices.DeleteFunc(slices.Clone(ep.IPs), func(p netip.Prefix) bool { return slices.Contains(skip, p) }))
}

// Collectors returns the manager's Prometheus collectors.
func (m *Manager) Collectors() []prometheus.Collector {
	return []prometheus.Collector{prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "coordino_endpoints_unrestorable",
		Help: "Stored endpoints whose addresses the node's blocks could not reserve at restore; DEL or GC removes them.",
	}, func() float64 { return float64(m.unrestored.count()) })}
}

// DrainDeleteQueue replays the DELs the plugin queued while the daemon was away.
func (m *Manager) DrainDeleteQueue(ctx context.Context, dir string) (int, error) {
	n, errs := deletequeue.Drain(dir, func(e deletequeue.Entry) error {
		inv, err := request.Parse(request.Del, queuedRequest(e.Request))
		if err != nil {
			return fmt.Errorf("%w: %v", deletequeue.ErrUnusable, err)
		}
		unlock := m.lockKey(inv.Key)
		defer unlock()
		if _, err := os.Lstat(e.Path); errors.Is(err, os.ErrNotExist) {
			return nil // an ADD of the key applied it meanwhile
		}
		m.log(ctx).Info("replaying queued DEL", zap.String("endpoint", inv.Key.String()), zap.Time("queuedAt", e.QueuedAt))
		if err := m.delLocked(ctx, inv.Key, nil); err != nil {
			return err
		}
		return e.Remove()
	})
	for _, err := range errs {
		m.log(ctx).Error("delete queue", zap.Error(err))
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("delete queue: %d entries failed, first: %w", len(errs), errs[0])
	}
	return n, nil
}

// applyQueuedDels applies and removes the queued DELs of k. The caller holds k's lock.
func (m *Manager) applyQueuedDels(ctx context.Context, k store.Key) error {
	if m.cfg.DeleteQueueDir == "" {
		return nil
	}
	entries, err := deletequeue.ForKey(m.cfg.DeleteQueueDir, k.Network, k.ContainerID, k.IfName)
	if err != nil {
		return err
	}
	for _, e := range entries {
		inv, err := request.Parse(request.Del, queuedRequest(e.Request))
		if err != nil || inv.Key != k {
			continue // not this key's; an unusable entry is the drain's to set aside
		}
		m.log(ctx).Info("applying queued DEL before ADD", zap.String("endpoint", k.String()), zap.Time("queuedAt", e.QueuedAt))
		if err := m.delLocked(ctx, k, nil); err != nil {
			return err
		}
		if err := e.Remove(); err != nil {
			return err
		}
	}
	return nil
}

// queuedRequest is a queued DEL as the gRPC service would have received it.
func queuedRequest(r *wire.Request) *cniv1.CNIRequest {
	return &cniv1.CNIRequest{ContainerId: r.ContainerID, Netns: r.Netns, Ifname: r.IfName, Args: r.Args, Path: r.Path, Stdin: r.Stdin}
}
