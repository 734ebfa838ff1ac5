package nftdp

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"go.uber.org/zap"
)

// Deferred deletion. The kernel commits a transaction that deletes
// anything (a chain, a set, a rule or a set element) only after an RCU
// grace period, 11-15 ms however much it deletes, where additions take well
// under a millisecond. So the DEL and ADD path delete nothing:
//
//   - A detach inserts a drop before its endpoint's rules: nothing passes
//     from or to its interface. The endpoint is dying: its entries stay, its
//     address still its own (no other interface may send from it), until
//     the sweep finishes its detach, or an attach that reuses its key,
//     interface or an address finishes it in its own transaction first.
//   - A change never deletes an object: its transaction takes away every
//     reference (verdict map elements, the rules that jump or look up),
//     empties the object and dooms it, left in the table unreferenced where
//     no packet can reach it. A change that wants a doomed object back (an
//     identity that returns) takes it off the doomed set as it is instead
//     of creating it: its name is fixed, and adding a chain that exists
//     costs as much as deleting one.
//
// The sweep finishes all pending detaches in one transaction and deletes
// all doomed objects in another once the table has been quiet for
// sweepDelay, or sooner when sweepMax wait, and never while an attach
// waits: N detaches cost two grace periods, off the ADD and DEL path.
//
// A daemon killed before its sweep leaves doomed objects and dying
// endpoints' chains. Open dooms endpoint chains that no eps element
// reaches; the rest (pair, identity and tier objects, endpoints without a
// record) it adopts as in use, and the first snapshot's flush, which
// compares everything, removes or dooms what no endpoint or policy wants.

// object is a chain or a set of the table, by name.
type object struct {
	set  bool
	name string
}

var (
	// sweepDelay is how long the table stays quiet before a sweep;
	// sweepRetry how long a sweep waits for an attach in progress, or after a
	// refused sweep.
	sweepDelay = 300 * time.Millisecond
	sweepRetry = 50 * time.Millisecond
	// sweepMax doomed objects and dying endpoints are swept without
	// waiting for quiet.
	sweepMax = 256
)

// doomChain leaves ch to the sweep once t commits; t must take away
// every reference to it.
func (d *Datapath) doomChain(t *txn, ch *nftables.Chain) {
	t.ops++
	t.last = append(t.last, func(c *nftables.Conn) error { c.FlushChain(ch); return nil })
	t.commit = append(t.commit, func() { d.doomed[object{name: ch.Name}] = struct{}{} })
}

// doomSet is doomChain of a set.
func (d *Datapath) doomSet(t *txn, s *nftables.Set) {
	t.ops++
	t.last = append(t.last, func(c *nftables.Conn) error { c.FlushSet(s); return nil })
	t.commit = append(t.commit, func() { d.doomed[object{set: true, name: s.Name}] = struct{}{} })
}

// reclaim says whether o is doomed, and if so takes it back when t
// commits: it exists, so t must not create it.
func (d *Datapath) reclaim(t *txn, o object) bool {
	if _, ok := d.doomed[o]; !ok {
		return false
	}
	t.commit = append(t.commit, func() { delete(d.doomed, o) })
	return true
}

// createChain queues ch's creation in t, or takes it back from the
// sweep, emptied again in case a killed run doomed it full.
func (d *Datapath) createChain(t *txn, ch *nftables.Chain) {
	if d.reclaim(t, object{name: ch.Name}) {
		t.create = append(t.create, func(c *nftables.Conn) error { c.FlushChain(ch); return nil })
		return
	}
	t.chainAdds++
	t.create = append(t.create, func(c *nftables.Conn) error { c.AddChain(ch); return nil })
}

// createSet is createChain of a set.
func (d *Datapath) createSet(t *txn, s *nftables.Set) {
	if d.reclaim(t, object{set: true, name: s.Name}) {
		t.create = append(t.create, func(c *nftables.Conn) error { c.FlushSet(s); return nil })
		return
	}
	t.create = append(t.create, func(c *nftables.Conn) error { return c.AddSet(s, nil) })
}

// scheduleSweep (re)arms the sweep after a change; callers hold mu.
// Each change pushes a pending sweep back, unless sweepMax objects wait.
func (d *Datapath) scheduleSweep() {
	if len(d.doomed) == 0 && len(d.dying) == 0 {
		return
	}
	switch {
	case d.sweepTimer == nil:
		d.sweepTimer = time.AfterFunc(sweepDelay, d.sweepLater)
	case !d.sweepArmed:
		d.sweepTimer.Reset(sweepDelay)
	case len(d.doomed)+len(d.dying) < sweepMax:
		d.sweepTimer.Reset(sweepDelay)
	default:
		return // armed, due soon enough
	}
	d.sweepArmed = true
}

// sweepLater is the sweep's timer: it gives way to attaches in progress.
func (d *Datapath) sweepLater() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sweepArmed = false
	if d.closed || len(d.doomed)+len(d.dying) == 0 {
		return
	}
	if len(d.waiting) > 0 || d.committing || d.exclusive {
		d.sweepTimer.Reset(sweepRetry)
		d.sweepArmed = true
		return
	}
	if err := d.sweepAll(); err != nil {
		d.sweepTimer.Reset(sweepDelay)
		d.sweepArmed = true
	}
}

// sweepAll finishes the detaches of the dying endpoints, in one
// transaction that removes their entries and dooms their chains and what
// their identities alone used, then sweeps. Callers hold mu.
func (d *Datapath) sweepAll() error {
	var err error
	if len(d.dying) > 0 {
		for _, r := range d.dying {
			d.finishDetach(r)
		}
		if err = d.flush(); err != nil {
			d.sweepFailed(err) // its changes stay pending
		}
		if len(d.waiting) > 0 {
			// Attaches booked in during that commit go first; the flush
			// armed the timer again.
			return err
		}
	}
	return errors.Join(err, d.sweep())
}

// sweepFailed counts a refused transaction of the sweep and logs the
// first of a run.
func (d *Datapath) sweepFailed(err error) {
	d.stats.sweepFailures++
	if !d.sweepFailing {
		d.sweepFailing = true
		d.log.Warn("the sweep's transaction was refused; what it removes stays unreferenced and it is retried", zap.Error(err))
	}
}

// sweep deletes every doomed object in one transaction: first the rules of
// the doomed chains (so no doomed object names another), then the sets,
// whose elements may still jump to doomed chains, then the chains. A
// refused sweep changes nothing in force: the objects stay doomed for the
// next one. Callers hold mu, which it releases while the kernel commits.
func (d *Datapath) sweep() error {
	for d.committing {
		d.settled.Wait()
	}
	if !d.synced || len(d.doomed) == 0 {
		return nil
	}
	batch := maps.Clone(d.doomed)
	c, err := d.newConn()
	if err != nil {
		return err
	}
	objs := slices.SortedFunc(maps.Keys(batch), func(a, b object) int { return strings.Compare(a.name, b.name) })
	chain := func(o object) *nftables.Chain { return &nftables.Chain{Table: d.lay.table, Name: o.name} }
	for _, o := range objs {
		if !o.set {
			c.FlushChain(chain(o))
		}
	}
	for _, o := range objs {
		if o.set {
			c.DelSet(&nftables.Set{Table: d.lay.table, Name: o.name})
		}
	}
	for _, o := range objs {
		if !o.set {
			c.DelChain(chain(o))
		}
	}
	d.failForTest(c)
	if err = d.commitUnlocked(c, nil); err != nil {
		d.sweepFailed(err)
		d.pruneDoomed()
		return fmt.Errorf("nftables datapath: sweep of %d unreferenced objects refused: %w", len(batch), err)
	}
	if d.sweepFailing {
		d.sweepFailing = false
		d.log.Info("unreferenced chains and sets deleted again", zap.Int("objects", len(batch)))
	}
	for o := range batch {
		delete(d.doomed, o)
	}
	d.stats.sweeps++
	d.stats.swept += uint64(len(batch))
	return nil
}

// pruneDoomed forgets doomed objects the table no longer holds (someone
// deleted them), which would make every sweep fail.
func (d *Datapath) pruneDoomed() {
	have, err := d.objects()
	if err != nil {
		return
	}
	for o := range d.doomed {
		if _, ok := have[o]; !ok {
			delete(d.doomed, o)
		}
	}
}

// objects lists the table's chains and named sets.
func (d *Datapath) objects() (map[object]struct{}, error) {
	out := map[object]struct{}{}
	chains, err := d.conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("nftables datapath: list chains of inet %s: %w", TableName, err)
	}
	for _, ch := range chains {
		if ch.Table.Name == TableName {
			out[object{name: ch.Name}] = struct{}{}
		}
	}
	sets, err := d.conn.GetSets(d.lay.table)
	if err != nil {
		return nil, fmt.Errorf("nftables datapath: list sets of inet %s: %w", TableName, err)
	}
	for _, s := range sets {
		if !s.Anonymous {
			out[object{set: true, name: s.Name}] = struct{}{}
		}
	}
	return out, nil
}
