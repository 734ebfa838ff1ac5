package store

import (
	"errors"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"
)

// groupCommit writes concurrent updates in one bbolt transaction, so that
// sixteen ADDs arriving together wait for one commit's fsyncs instead of
// queueing for sixteen. A write that arrives while a commit is in flight
// waits for it and goes into the next one, together with every other write
// that arrived meanwhile; a write that finds no commit in flight commits at
// once, so a lone ADD waits no longer than before. Each write returns only
// once the transaction holding it is durable, with its own outcome: a write
// that fails is taken out and the others are committed without it.
//
// bbolt's own DB.Batch is not used: it holds every batch open for
// MaxBatchDelay (10 ms by default) before committing, which a lone ADD
// would pay in full; here a batch is whatever queued during the previous
// commit, so no write waits for a timer.
type groupCommit struct {
	mu      sync.Mutex
	pending []*write
	busy    bool // a leader is committing; the next one is chosen from pending
	commits atomic.Uint64
}

type write struct {
	// fn applies the write; it may run more than once (in a transaction
	// that is rolled back because another write failed), so it must not
	// change anything outside the transaction.
	fn   func(*bolt.Tx) error
	done chan error // errLead, then the outcome
}

// errLead tells a waiting write that it commits the pending ones next.
var errLead = errors.New("lead the next group commit")

// update applies fn in a durable transaction shared with concurrent writes.
func (s *Store) update(fn func(*bolt.Tx) error) error {
	g := &s.group
	w := &write{fn: fn, done: make(chan error, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, w)
	if !g.busy {
		g.busy = true
		w.done <- errLead
	}
	g.mu.Unlock()
	for {
		err := <-w.done
		if err != errLead {
			return err
		}
		g.mu.Lock()
		batch := g.pending
		g.pending = nil
		g.mu.Unlock()
		s.commitBatch(batch) // sends w its outcome
		g.mu.Lock()
		if len(g.pending) > 0 {
			g.pending[0].done <- errLead
		} else {
			g.busy = false
		}
		g.mu.Unlock()
	}
}

// commitBatch commits batch in one transaction and tells each write its outcome.
func (s *Store) commitBatch(batch []*write) {
	for len(batch) > 0 {
		failed := -1
		var ferr error
		err := s.db.Update(func(tx *bolt.Tx) error {
			for i, w := range batch {
				if err := w.fn(tx); err != nil {
					failed, ferr = i, err
					return err
				}
			}
			return nil
		})
		if failed >= 0 {
			batch[failed].done <- ferr
			batch = append(batch[:failed:failed], batch[failed+1:]...)
			continue
		}
		if err == nil {
			s.group.commits.Add(1)
		}
		for _, w := range batch {
			w.done <- err
		}
		return
	}
}
