package daemon

import (
	"context"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/flows"
	"github.com/coordino/coordino/daemon/inspect"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/plugin"
)

// startInspect serves the read-only inspection socket for coordinoctl.
func startInspect(ctx context.Context, o *config.Options, st *store.Store, pool *ipam.Pool, dp *datapath.Datapath, hub *flows.Hub, log *zap.Logger) (stop func(), err error) {
	svc := inspect.New(inspect.Config{
		NodeName:   o.NodeName,
		Standalone: o.Standalone,
		AttachMode: o.AttachMode,
		RunDir:     o.RunDir,
		QueueDir:   filepath.Join(o.RunDir, plugin.DeleteQueueDir),
		Store:      st,
		Pool:       pool,
		Datapath:   dp,
		Hub:        hub,
		Options:    o,
		Log:        log.Named("inspect"),
	})
	return svc.Serve(ctx)
}
