package nftdp

import "errors"

// Group commit. A transaction's kernel commit is most of an attach's cost
// and the kernel takes one at a time, so attaches that arrive while one is
// in the kernel book their endpoints in and wait; the first of them to
// find the kernel free commits everything pending in one transaction, and
// each returns when the transaction that includes it ends.
//
// A refused transaction leaves the previous state whole, as always, and
// undoes every attach it carried (forget). Its attaches must not take each
// other down: when it carried more than one, each tries again alone
// (exclusive: no other attach books in until it is settled), so a bad
// endpoint fails with its own error and the others succeed.

// errRetryAlone tells an attach that the batch it was in was refused.
var errRetryAlone = errors.New("nftables datapath: the attach's batch was refused; retry alone")

// attachWait is an attach booked in and waiting for its transaction.
type attachWait struct {
	r, old *record
	alone  bool
	done   bool
	err    error
}

// enterAttach waits until attaches may book in, and for an attach that
// retries alone, until it is the only one: the attaches already waiting
// are committed first. It returns what ends that. Callers hold mu.
func (d *Datapath) enterAttach(alone bool) (leave func()) {
	for d.exclusive {
		d.settled.Wait()
	}
	if !alone {
		return func() {}
	}
	d.exclusive = true
	for len(d.waiting) > 0 {
		_ = d.flush() // their errors are theirs: flush settles them
	}
	return func() {
		d.exclusive = false
		d.settled.Broadcast()
	}
}

// commitAttach waits until w is settled by a transaction: one in the
// kernel when it booked in ends first, then the first waiter to find the
// kernel free commits for all. Callers hold mu.
func (d *Datapath) commitAttach(w *attachWait) error {
	d.waiting = append(d.waiting, w)
	for !w.done {
		if d.committing {
			d.settled.Wait()
			continue
		}
		_ = d.flush() // settles w: it was waiting when the flush began
	}
	return w.err
}

// settle tells the attaches a transaction carried how it ended. A refused
// one undoes them, newest first (one may replace another's endpoint).
func (d *Datapath) settle(batch []*attachWait, err error) {
	for i := len(batch) - 1; i >= 0; i-- {
		w := batch[i]
		w.done, w.err = true, err
		if err == nil {
			continue
		}
		d.forget(w.r, w.old)
		if len(batch) > 1 && !w.alone {
			w.err = errRetryAlone
		}
	}
}
