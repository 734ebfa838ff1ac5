package endpoint

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/plugin/deletequeue"
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

// DrainDeleteQueue replays the DELs the plugin queued while the daemon was away.
func (m *Manager) DrainDeleteQueue(dir string) (int, error) {
	n, errs := deletequeue.Drain(dir, func(e deletequeue.Entry) error {
		inv, err := request.Parse(request.Del, e.Request)
		if err != nil {
			return fmt.Errorf("%w: %v", deletequeue.ErrUnusable, err)
		}
		m.Log.Info("replaying queued DEL", zap.String("endpoint", inv.Key.String()), zap.Time("queuedAt", e.QueuedAt))
		return m.del(inv.Key, e.QueuedAt)
	})
	for _, err := range errs {
		m.Log.Error("delete queue", zap.Error(err))
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("delete queue: %d entries failed, first: %w", len(errs), errs[0])
	}
	return n, nil
}
