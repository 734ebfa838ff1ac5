package main

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"

	"github.com/coordino/coordino/test/harness"
)

// Baseline systems: the same plugin and conflists as coordino and the
// chained system, served by another coordino-daemon build (-baseline-daemon,
// e.g. main's), on their own nodes, measured in the same rounds.
const (
	SysCoordinoBase = SysCoordino + "@baseline"
	SysChainedBase  = SysChained + "@baseline"
)

// Address ranges of the baseline systems, disjoint from the others.
const (
	coordinoBaseCIDR = "10.88.0.0/16"
	chainedBaseCIDR  = "10.89.0.0/16"
)

// setupBaseline adds the two baseline systems; a node that fails to start
// is that system's error, not the run's.
func (b *bed) setupBaseline(bin string, newNode nodeMaker) error {
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("baseline daemon: %w", err)
	}
	cn, err := newNode("coordino-base", []string{coordinoBaseCIDR}, harness.NodeOptions{ExtraArgs: b.daemonArgs, DaemonBinary: bin})
	if err != nil {
		return err
	}
	primary := &system{name: SysCoordinoBase, node: cn, daemon: true}
	if primary.cni, err = cn.NewCNI(cn.PrimaryConflist("coordino", "1.1.0")); err != nil {
		return err
	}
	if err := cn.StartDaemon(); err != nil {
		primary.fail(fmt.Errorf("start baseline daemon: %w", err))
	}
	chained, err := newChained(SysChainedBase, "chained-base", chainedBaseCIDR, harness.NodeOptions{ExtraArgs: b.daemonArgs, DaemonBinary: bin}, newNode)
	if err != nil {
		return err
	}
	b.systems = append(b.systems, primary, chained)
	return nil
}

// fingerprint is fingerprint() plus the baseline daemon, if any.
func (b *bed) fingerprint() map[string]string {
	out := fingerprint()
	if b.baselineDaemon != "" {
		out["coordino-daemon@baseline"] = fileSum(b.baselineDaemon)
	}
	return out
}

// fileSum is a short SHA-256 of a file, or "missing".
func fileSum(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "missing"
	}
	return fmt.Sprintf("%x", sha256.Sum256(data))[:12]
}

// writeBaseline prints this build against the baseline daemon, sequential
// ADD: client-side p50, the daemon's own p50 and its CPU per ADD, for the
// primary system and for the chained cost.
func (r *Report) writeBaseline(w io.Writer) {
	if len(r.Rows) == 0 {
		return
	}
	seq := r.Rows[0].Mode // the sequential mode comes first
	if r.row(seq, VerbAdd, SysCoordinoBase).N == 0 && r.row(seq, VerbAdd, SysChainedBase).N == 0 {
		return
	}
	daemonP50 := func(sys string) float64 {
		for _, x := range r.Daemon {
			if x.Mode == seq && x.Verb == VerbAdd && x.System == sys {
				return x.P50
			}
		}
		return 0
	}
	daemonCPU := func(sys string) float64 {
		for _, x := range r.Rows {
			if x.Mode == seq && x.Verb == VerbAdd && x.System == sys && x.CPU != nil {
				return x.CPU.Daemon
			}
		}
		return 0
	}
	ref := r.row(seq, VerbAdd, SysRef).P50
	fmt.Fprintf(w, "\nThis build against the baseline daemon (%s ADD, same run, same plugin; ms):\n", seq)
	fmt.Fprintf(w, "  %-46s %10s %10s\n", "", "this", "baseline")
	for _, x := range []struct {
		name       string
		this, base float64
	}{
		{"primary ADD p50 (client)", r.row(seq, VerbAdd, SysCoordino).P50, r.row(seq, VerbAdd, SysCoordinoBase).P50},
		{"primary ADD p50 inside the daemon", daemonP50(SysCoordino), daemonP50(SysCoordinoBase)},
		{"primary ADD daemon CPU per op", daemonCPU(SysCoordino), daemonCPU(SysCoordinoBase)},
		{"chained cost p50 (chained - reference)", r.row(seq, VerbAdd, SysChained).P50 - ref, r.row(seq, VerbAdd, SysChainedBase).P50 - ref},
		{"chained ADD p50 inside the daemon", daemonP50(SysChained), daemonP50(SysChainedBase)},
		{"chained ADD daemon CPU per op", daemonCPU(SysChained), daemonCPU(SysChainedBase)},
	} {
		fmt.Fprintf(w, "  %-46s %10.2f %10.2f\n", x.name, x.this, x.base)
	}
}
