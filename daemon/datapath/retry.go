package datapath

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// Retry backoff after a failed flush.
const (
	defaultRetryDelay = time.Second
	maxRetryDelay     = 30 * time.Second
)

// retrier re-runs the writes that failed (the policy maps' flush, node
// isolation) later, with exponential backoff, until nothing is left. The
// parts call schedule after a failed write and done after a successful
// one, holding the datapath's lock; the retry itself takes that lock.
type retrier struct {
	lock sync.Locker
	log  *zap.Logger
	base time.Duration
	// work is the retry, run under lock; idle reports whether no part
	// has writes left, which ends the backoff.
	work func() error
	idle func() bool

	// timer is set while a retry is scheduled.
	timer  *time.Timer
	delay  time.Duration
	closed bool
}

func newRetrier(lock sync.Locker, base time.Duration, log *zap.Logger, work func() error, idle func() bool) *retrier {
	if base <= 0 {
		base = defaultRetryDelay
	}
	return &retrier{lock: lock, log: log, base: base, work: work, idle: idle}
}

// done ends the backoff once no part has writes left.
func (r *retrier) done() {
	if r.idle() {
		r.delay = 0
	}
}

// schedule runs work again after the current backoff, unless a retry is
// already scheduled or the datapath is closed.
func (r *retrier) schedule() {
	if r.timer != nil || r.closed {
		return
	}
	delay := r.delay
	if delay == 0 {
		delay = r.base
	}
	r.delay = min(2*delay, maxRetryDelay)
	r.timer = time.AfterFunc(delay, func() {
		r.lock.Lock()
		defer r.lock.Unlock()
		r.timer = nil
		if r.closed {
			return
		}
		if err := r.work(); err != nil {
			// Once per episode: a full map is also logged by mapHealth.
			if delay == r.base {
				r.log.Error("policy map update retry failed; retrying with backoff", zap.Error(err))
			} else {
				r.log.Debug("policy map update retry failed", zap.Error(err), zap.Duration("after", delay))
			}
		} else {
			r.log.Info("policy maps up to date after retry")
		}
	})
}

// stop cancels a scheduled retry for good (Close).
func (r *retrier) stop() {
	r.closed = true
	if r.timer != nil {
		r.timer.Stop()
	}
}
