package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// UpdatePolicy replaces the policy snapshot: the objects that changed since
// the last call are normalized, fed to the policy engine, and the resulting
// map differences written. Invalid policies are skipped and reported in the
// error (counted in coordino_policy_invalid); valid ones are applied
// regardless. A map write failure is reported too and retried in the
// background; what was written never allows more than the old or the new
// policy would.
func (d *Datapath) UpdatePolicy(s policy.Snapshot) error {
	var unenforced error
	if !d.tiers {
		unenforced = policy.LeaveOutClusterPolicies(&s, "datapath: this kernel's verifier refuses the programs that decide the tiers (docs/kernels.md)")
	}
	d.snapMu.Lock()
	defer d.snapMu.Unlock()
	delta, invalid := d.snap.Diff(s)
	invalid = errors.Join(invalid, unenforced)
	d.metrics.setCompileError(invalid)
	defer d.metrics.policies.Set(float64(len(d.snap.Policies)))

	d.mu.Lock()
	defer d.mu.Unlock()
	delta.Feed(d.engine)
	d.synced = true // the first flush is a full one (mapWriter.markAll)
	d.iso.setPolicies(s.NodeIsolation)
	err := errors.Join(d.flush(""), d.iso.apply())
	if !d.cidrsRetained && err == nil {
		// Numbers restored from the pins that no policy uses any more.
		keep := map[netip.Prefix]bool{}
		d.engine.Prefixes(func(p netip.Prefix, _ identity.ID) { keep[p] = true })
		d.cidrs.Retain(keep)
		d.cidrsRetained = true
	}
	if err != nil {
		return fmt.Errorf("datapath: apply policy: %w", errors.Join(err, invalid))
	}
	return invalid
}
