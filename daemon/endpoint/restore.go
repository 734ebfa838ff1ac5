package endpoint

import (
	"errors"
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/plugin/deletequeue"
	"github.com/coordino/coordino/plugin/wire"
	cniv1 "github.com/coordino/coordino/proto/cni/v1"
)

// Restore rebuilds the allocator from the store. Call it once, before
// serving and before DrainDeleteQueue.
func (m *Manager) Restore() error {
	eps, err := m.Store.List("")
	if err != nil {
		return err
	}
	for _, ep := range eps {
		if ep.Mode != store.ModePrimary {
			continue
		}
		if err := m.Pool.Reserve(ep.IPs); err != nil {
			return fmt.Errorf("restore addresses of %s: %w", ep.Key, err)
		}
	}
	m.Log.Info("restored endpoints", zap.Int("count", len(eps)))
	return nil
}

// Queued DELs are ordered against ADDs by the key lock and the queue file
// alone, never by clocks: the runtime issues an ADD only after the DEL that
// precedes it returned, so that DEL's file exists when the ADD starts, and
// the ADD applies and removes it before creating anything. A drain therefore
// applies an entry only if its file still exists under the key's lock.

// DrainDeleteQueue replays the DELs the plugin queued while the daemon was away.
func (m *Manager) DrainDeleteQueue(dir string) (int, error) {
	n, errs := deletequeue.Drain(dir, func(e deletequeue.Entry) error {
		inv, err := request.Parse(request.Del, queuedRequest(e.Request))
		if err != nil {
			return fmt.Errorf("%w: %v", deletequeue.ErrUnusable, err)
		}
		unlock := m.locks.lock(inv.Key.String())
		defer unlock()
		if _, err := os.Lstat(e.Path); errors.Is(err, os.ErrNotExist) {
			return nil // an ADD of the key applied it meanwhile
		}
		m.Log.Info("replaying queued DEL", zap.String("endpoint", inv.Key.String()), zap.Time("queuedAt", e.QueuedAt))
		if err := m.delLocked(inv.Key, nil); err != nil {
			return err
		}
		return e.Remove()
	})
	for _, err := range errs {
		m.Log.Error("delete queue", zap.Error(err))
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("delete queue: %d entries failed, first: %w", len(errs), errs[0])
	}
	return n, nil
}

// applyQueuedDels applies and removes the queued DELs of k. The caller holds k's lock.
func (m *Manager) applyQueuedDels(k store.Key) error {
	if m.DeleteQueueDir == "" {
		return nil
	}
	entries, err := deletequeue.List(m.DeleteQueueDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		inv, err := request.Parse(request.Del, queuedRequest(e.Request))
		if err != nil || inv.Key != k {
			continue // not this key's; an unusable entry is the drain's to set aside
		}
		m.Log.Info("applying queued DEL before ADD", zap.String("endpoint", k.String()), zap.Time("queuedAt", e.QueuedAt))
		if err := m.delLocked(k, nil); err != nil {
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
