// Package schema versions the state Coordino keeps across restarts: the
// endpoint store, the pinned BPF maps, the last-known cluster state and the
// delete-queue records. Each piece of state carries a Stamp: the version of
// its layout and the oldest version that can still read it. A build knows
// the version it writes (Format.Current); with Format.Check it migrates
// older state forward, reads newer state whose change was additive, and
// refuses state it cannot read with an error naming both versions, so a
// rolled-back daemon never rewrites, or flushes, what a newer one left.
package schema
