package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/endpoint"
	"github.com/coordino/coordino/daemon/flows"
	"github.com/coordino/coordino/daemon/inspect"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/daemon/metrics"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/server"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/proto/cni/v1/wire"
	flowv1 "github.com/coordino/coordino/proto/flow/v1"
)

// MetricsAddrFile is written in the run dir with the metrics listener's
// address, so tools find it when the port was chosen by the kernel.
const MetricsAddrFile = "metrics.addr"

// queueDrainInterval bounds how long a DEL queued by a plugin that raced a
// daemon restart waits before it is applied.
const queueDrainInterval = 5 * time.Second

// Run serves until ctx is done. Start-up order matters: state is restored,
// the delete queue drained and orphans reclaimed before the socket exists,
// so no ADD can interleave with recovery.
func Run(ctx context.Context, o *config.Options, log *zap.Logger) error {
	log, logs := inspect.RecordLogs(log) // kept for coordinoctl bugtool
	stopTracing, err := startTracing(ctx, o, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	// Once, before anything chooses a path by it (docs/kernels.md).
	features := kernel.Probe()
	features.Log(log)
	pool, err := ipam.NewPool(o.Prefixes)
	if err != nil {
		return fmt.Errorf("pod CIDRs: %w", err)
	}
	_, v6 := pool.Families()
	if err := netsetup.EnableForwarding(v6); err != nil {
		return err
	}
	nodes := newNodePeers(o, log)
	mtuOverhead, xn, err := startCrossNode(ctx, o, features, log, nodes.publish)
	if err != nil {
		return err
	}
	st, err := store.Open(o.StateDir)
	if err != nil {
		return err
	}
	defer st.Close()

	m := metrics.New(pool, func() (map[string]int, error) {
		eps, err := st.List("")
		counts := map[string]int{}
		for _, ep := range eps {
			counts[string(ep.Mode)]++
		}
		return counts, err
	})
	if err := m.Register(features.Collector()); err != nil {
		return err
	}
	hub := flows.NewHub()
	kube, err := newKubernetesSource(o, pool, m, log, xn)
	if err != nil {
		return err
	}
	dp, err := startDatapath(ctx, o, features, m, hub, log, kube)
	if err != nil {
		return err
	}
	nodes.bind(ctx, dp)
	if dp != nil {
		defer dp.Close() // releases FDs; pins keep pods enforced while the daemon is away
	} else if kube != nil {
		if err := runSource(ctx, kube, discardPolicy{}, log); err != nil {
			return err
		}
	}
	if kube != nil {
		// Blocks arrived with the source's first state.
		if _, v6 := pool.Families(); v6 {
			if err := netsetup.EnableForwarding(v6); err != nil {
				return err
			}
		}
	}
	epConfig := endpoint.Config{
		PinDir:     filepath.Join(o.RunDir, "netns"),
		DefaultMTU: netsetup.DefaultMTU() - mtuOverhead,
		Pool:       pool,
		Store:      st,
		Network:    endpoint.Host{},
		Log:        log,

		DeleteQueueDir: filepath.Join(o.RunDir, wire.DeleteQueueDir),
	}
	// Set only when there is one: a nil pointer in an interface is not a nil interface.
	if dp != nil {
		epConfig.Datapath = dp
	}
	if kube != nil {
		epConfig.PodLabels = kube
	}
	mgr := endpoint.New(epConfig)
	if err := m.Register(mgr.Collectors()...); err != nil {
		return err
	}
	addr, err := m.Serve(ctx, o.MetricsAddr)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.RunDir, 0o700); err != nil {
		return fmt.Errorf("create run dir %s: %w", o.RunDir, err)
	}
	if err := os.WriteFile(filepath.Join(o.RunDir, MetricsAddrFile), []byte(metrics.AddrString(addr)+"\n"), 0o600); err != nil {
		return fmt.Errorf("write metrics address: %w", err)
	}
	log.Info("metrics listening", zap.String("addr", metrics.AddrString(addr)))

	if err := mgr.Restore(); err != nil {
		return err
	}
	queueDir := filepath.Join(o.RunDir, wire.DeleteQueueDir)
	if n, err := mgr.DrainDeleteQueue(ctx, queueDir); err != nil {
		log.Error("some queued DELs could not be applied; they stay queued", zap.Error(err))
	} else if n > 0 {
		log.Info("applied queued DELs", zap.Int("count", n))
	}
	if err := mgr.ReclaimOrphans(ctx); err != nil {
		log.Error("reclaiming orphans", zap.Error(err))
	}
	if err := mgr.ReconcileDatapath(); err != nil {
		return err
	}
	if kube != nil {
		// Only now may label and identity changes re-attach endpoints.
		kube.SetRefresher(mgr.RefreshEndpoints)
		publishEndpoints(ctx, kube, st, dp)
	}

	stopInspect, err := startInspect(ctx, o, st, pool, dp, hub, m, xn, features, logs, log)
	if err != nil {
		return err
	}
	defer stopInspect()

	socket := filepath.Join(o.RunDir, wire.SocketName)
	l, err := server.Listen(socket)
	if err != nil {
		return err
	}
	g := server.New(mgr, m, log).GRPCServer()
	flowv1.RegisterObserverServer(g, flows.NewService(hub))
	served := make(chan error, 1)
	go func() { served <- g.Serve(l) }()
	m.SetReady(true)
	log.Info("serving CNI", zap.String("socket", socket), zap.String("node", o.NodeName), zap.Stringers("podCIDRs", o.Prefixes))

	tick := time.NewTicker(queueDrainInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			m.SetReady(false)
			stopped := make(chan struct{})
			go func() { g.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(10 * time.Second):
				g.Stop()
			}
			return nil
		case err := <-served:
			if err != nil && !errors.Is(err, context.Canceled) {
				return fmt.Errorf("gRPC server: %w", err)
			}
			return nil
		case <-tick.C:
			if _, err := mgr.DrainDeleteQueue(ctx, queueDir); err != nil {
				log.Error("delete queue", zap.Error(err))
			}
		}
	}
}
