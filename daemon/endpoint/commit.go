package endpoint

import (
	"context"

	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/daemon/tracing"
)

// pendingCommit is an endpoint record being written durably in the
// background, so that an ADD's kernel work proceeds while the store waits
// for fsync.
type pendingCommit struct {
	done chan struct{}
	err  error
}

// commitInBackground starts writing ep. ep belongs to the commit until wait
// returns: the commit assigns its generation.
func (m *Manager) commitInBackground(ctx context.Context, ep *store.Endpoint) *pendingCommit {
	c := &pendingCommit{done: make(chan struct{})}
	go func() {
		_, span := tracing.Start(ctx, "store.commit")
		c.err = m.cfg.Store.Put(ep)
		tracing.End(span, c.err)
		close(c.done)
	}()
	return c
}

// wait returns the commit's outcome once the record is durable or the
// write failed; it may be called any number of times.
func (c *pendingCommit) wait() error {
	<-c.done
	return c.err
}
