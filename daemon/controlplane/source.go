package controlplane

import (
	"context"

	"github.com/coordino/coordino/daemon/policy"
)

// Sink receives complete policy snapshots; *datapath.Datapath is one.
type Sink interface {
	// UpdatePolicy replaces all policy with s. An error about some invalid
	// policies does not prevent the valid ones from being applied.
	UpdatePolicy(s policy.Snapshot) error
}

// Source delivers policy snapshots to a sink of type S until its context
// ends: a Sink for the standalone source, one that takes more (identities,
// remote endpoints) for the Kubernetes source.
type Source[S Sink] interface {
	// Run delivers the first snapshot, then every change, until ctx ends.
	Run(ctx context.Context, sink S) error
	// Synced is closed once the first snapshot has been delivered; the
	// daemon should not serve ADD before, so no pod starts unprotected.
	Synced() <-chan struct{}
}
