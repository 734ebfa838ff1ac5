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
	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/endpoint"
	"github.com/coordino/coordino/daemon/flows"
	"github.com/coordino/coordino/daemon/inspect"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/k8s"
	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/daemon/metrics"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/nftdp"
	"github.com/coordino/coordino/daemon/peers"
	"github.com/coordino/coordino/daemon/server"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/internal/process"
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
	ctx, cancel := context.WithCancel(ctx)
	p, err := start(ctx, o, log)
	defer p.stop()
	defer cancel() // before stop: the parts that wait for their goroutines end them
	if err != nil {
		return err
	}
	return p.serve(ctx)
}

// parts are the daemon's started parts: start wires them in order, serve
// uses them, stop releases them in reverse.
type parts struct {
	o        *config.Options
	log      *zap.Logger
	logs     *inspect.LogRing
	features *kernel.Features
	pool     *ipam.Pool
	st       *store.Store
	m        *metrics.Metrics
	hub      *flows.Hub
	xn       *crossNode
	masq     *masq
	ranges   *clusterRanges
	kube     *k8s.Source        // nil standalone
	dp       *datapath.Datapath // the eBPF datapath; nil with nftables or --no-datapath
	enforcer enforcer           // the datapath enforcing policy; nil with --no-datapath
	nft      *nftdp.Datapath    // the nftables datapath; nil with eBPF or --no-datapath
	choice   datapathChoice
	mgr      *endpoint.Manager
	queueDir string
	stops    []func()
}

// onStop registers f to run when the daemon stops.
func (p *parts) onStop(f func()) { p.stops = append(p.stops, f) }

// stop releases what start acquired, last first.
func (p *parts) stop() {
	for i := len(p.stops) - 1; i >= 0; i-- {
		p.stops[i]()
	}
}

// start wires the daemon: the kernel probe, IPAM, cross-node routing, the
// store, metrics, the control-plane source and the datapath (returning
// once the first policy is in force), forwarding, the endpoint manager and
// its recovery, and inspection. What it started is in the parts, also on
// error, for stop.
func start(ctx context.Context, o *config.Options, log *zap.Logger) (*parts, error) {
	p := &parts{o: o, queueDir: filepath.Join(o.RunDir, wire.DeleteQueueDir), hub: flows.NewHub()}
	p.log, p.logs = inspect.RecordLogs(log) // kept for coordinoctl bugtool
	// Before anything touches state: a daemon rolled back below the
	// version of the state it finds stops here, leaving it (and the policy
	// in the pinned maps) in force for a build that reads it.
	if err := store.CheckSchema(o.StateDir); err != nil {
		return p, err
	}
	if !o.NoDatapath {
		if err := datapath.CheckPinSchema(o.BPFDir); err != nil {
			return p, err
		}
	}
	stopTracing, err := startTracing(ctx, o, p.log)
	if err != nil {
		return p, err
	}
	p.onStop(stopTracing)
	// Once, before anything chooses a path by it (docs/kernels.md).
	p.features = kernel.Probe()
	p.features.Log(p.log)
	if p.pool, err = ipam.NewPool(o.Prefixes); err != nil {
		return p, fmt.Errorf("pod CIDRs: %w", err)
	}
	nodes := newNodePeers(o, p.log)
	p.masq = startMasquerade(ctx, o, p.log)
	mtuOverhead, xn, err := startCrossNode(ctx, o, p.features, p.log, func(s peers.Set) {
		nodes.publish(s)
		p.masq.setPeers(s)
	})
	if err != nil {
		return p, err
	}
	p.xn = xn
	if p.st, err = store.Open(o.StateDir); err != nil {
		return p, err
	}
	p.onStop(func() { p.st.Close() })
	if err := p.startMetrics(); err != nil {
		return p, err
	}
	if p.kube, err = newKubernetesSource(o, p.pool, p.m, p.log, xn); err != nil {
		return p, err
	}
	if p.kube != nil {
		// Its last save at exit finishes, rather than leave a temporary
		// file in the state dir.
		p.onStop(func() { p.kube.Wait(5 * time.Second) })
	}
	if p.ranges, err = startRanges(ctx, o, p.masq, p.log); err != nil {
		return p, err
	}
	if err := p.startPolicy(ctx); err != nil {
		return p, err
	}
	nodes.bind(ctx, p.dp)
	nodes.bindNFTables(p.nft)
	// One decision, once the first state is in: in Kubernetes mode that
	// brought the node's blocks, so the pool's families are known now in
	// either mode.
	_, v6 := p.pool.Families()
	if err := netsetup.EnableForwarding(v6); err != nil {
		return p, err
	}
	if err := p.startEndpoints(ctx, mtuOverhead); err != nil {
		return p, err
	}
	stopInspect, err := startInspect(ctx, o, p.st, p.pool, p.dp, p.enforcer, p.choice, p.hub, p.m, xn, p.masq, p.features, p.logs, p.log)
	if err != nil {
		return p, err
	}
	p.onStop(stopInspect)
	return p, nil
}

// startMetrics builds the daemon's metrics (served later, by
// startEndpoints, once every part has registered its own).
func (p *parts) startMetrics() error {
	p.m = metrics.New(p.pool, func() (map[string]int, error) {
		eps, err := p.st.List("")
		counts := map[string]int{}
		for _, ep := range eps {
			counts[string(ep.Mode)]++
		}
		return counts, err
	})
	return p.m.Register(p.features.Collector(), p.masq)
}

// startPolicy starts the datapath --datapath names with its policy source
// (auto: eBPF, else nftables where the kernel refuses the programs), or
// without a datapath only the Kubernetes source (its blocks and labels
// still serve ADD); it returns once the first state is applied.
func (p *parts) startPolicy(ctx context.Context) error {
	defer p.registerChoice()
	if p.o.NoDatapath {
		p.choice = datapathChoice{kind: "none"}
		p.log.Warn("datapath disabled (--no-datapath): NetworkPolicy is NOT enforced")
		if p.kube == nil {
			return nil
		}
		return runSource[k8s.Sink](ctx, p.kube, k8s.Discard{}, p.log)
	}
	if p.o.Datapath != "nftables" {
		// Service ranges from the API, when they come within moments, so
		// the post-DNAT stage starts with them.
		dp, err := startEBPF(ctx, p.o, p.features, p.m, p.hub, p.log, p.kube, p.ranges.initialServices(ctx))
		var refused *datapath.LoadError
		switch {
		case err == nil:
			p.dp, p.enforcer, p.choice = dp, dp, datapathChoice{kind: "ebpf"}
			p.ranges.bind(dp)
			p.onStop(func() { dp.Close() }) // releases FDs; pins keep pods enforced while the daemon is away
			// A table a previous nftables run left would keep enforcing
			// that run's policy beside this one's: it goes once eBPF is in force.
			if err := nftdp.Remove(); err != nil {
				p.log.Error("the nftables datapath's table of a previous run is left", zap.Error(err))
			}
			return nil
		case p.o.Datapath == "ebpf" || !errors.As(err, &refused):
			return err
		}
		// Said once, here; status and the metric keep saying it.
		p.choice = datapathChoice{kind: "nftables", fallback: err.Error()}
		p.log.Warn("the eBPF datapath cannot run on this node; enforcing NetworkPolicy with nftables (--datapath=auto)", zap.Error(err))
	} else {
		p.choice = datapathChoice{kind: "nftables"}
	}
	dp, err := startNFTables(ctx, p.o, p.m, p.hub, p.log, p.kube)
	if err != nil {
		return err
	}
	p.enforcer, p.nft = dp, dp
	p.onStop(func() { dp.Close() }) // the table stays in force while the daemon is away
	return nil
}

// startEndpoints builds the endpoint manager, serves metrics, recovers
// (restore, queued DELs, orphans, datapath reconcile) and only then lets
// the Kubernetes source re-attach endpoints and publish them.
func (p *parts) startEndpoints(ctx context.Context, mtuOverhead int) error {
	cfg := endpoint.Config{
		PinDir:     filepath.Join(p.o.RunDir, "netns"),
		DefaultMTU: netsetup.DefaultMTU() - mtuOverhead,
		Pool:       p.pool,
		Store:      p.st,
		Network:    endpoint.Host{},
		Log:        p.log,
		Chained:    p.masq,

		DeleteQueueDir: p.queueDir,
	}
	// Set only when there is one: a nil pointer in an interface is not a nil interface.
	if p.enforcer != nil {
		cfg.Datapath = p.enforcer
	}
	if p.kube != nil {
		cfg.PodLabels = p.kube
	}
	p.mgr = endpoint.New(cfg)
	if err := p.m.Register(p.mgr.Collectors()...); err != nil {
		return err
	}
	if err := p.serveMetrics(ctx); err != nil {
		return err
	}
	if err := p.recover(ctx); err != nil {
		return err
	}
	if p.kube != nil {
		// Only now may label and identity changes re-attach endpoints.
		p.kube.SetRefresher(p.mgr.RefreshEndpoints)
		if p.enforcer != nil {
			publishEndpoints(ctx, p.kube, p.st, p.enforcer)
		}
	}
	return nil
}

// serveMetrics serves metrics and health, and writes where in the run dir.
func (p *parts) serveMetrics(ctx context.Context) error {
	addr, err := p.m.Serve(ctx, p.o.MetricsAddr)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(p.o.RunDir, 0o700); err != nil {
		return fmt.Errorf("create run dir %s: %w", p.o.RunDir, err)
	}
	if err := os.WriteFile(filepath.Join(p.o.RunDir, MetricsAddrFile), []byte(process.AddrString(addr)+"\n"), 0o600); err != nil {
		return fmt.Errorf("write metrics address: %w", err)
	}
	p.log.Info("metrics listening", zap.String("addr", process.AddrString(addr)))
	return nil
}

// recover restores the stored endpoints, applies the DELs queued while the
// daemon was away and reclaims orphans, then brings the datapath in line.
func (p *parts) recover(ctx context.Context) error {
	if err := p.mgr.Restore(); err != nil {
		return err
	}
	if n, err := p.mgr.DrainDeleteQueue(ctx, p.queueDir); err != nil {
		p.log.Error("some queued DELs could not be applied; they stay queued", zap.Error(err))
	} else if n > 0 {
		p.log.Info("applied queued DELs", zap.Int("count", n))
	}
	if err := p.mgr.ReclaimOrphans(ctx); err != nil {
		p.log.Error("reclaiming orphans", zap.Error(err))
	}
	return p.mgr.ReconcileDatapath()
}

// serve opens the CNI socket and serves it until ctx is done, draining the
// delete queue now and then.
func (p *parts) serve(ctx context.Context) error {
	socket := filepath.Join(p.o.RunDir, wire.SocketName)
	l, err := server.Listen(socket)
	if err != nil {
		return err
	}
	g := server.New(p.mgr, p.m, p.log).GRPCServer()
	flowv1.RegisterObserverServer(g, flows.NewService(p.hub))
	served := make(chan error, 1)
	go func() { served <- g.Serve(l) }()
	p.m.SetReady(true)
	p.log.Info("serving CNI", zap.String("socket", socket), zap.String("node", p.o.NodeName), zap.Stringers("podCIDRs", p.o.Prefixes))

	tick := time.NewTicker(queueDrainInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			p.m.SetReady(false)
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
			if _, err := p.mgr.DrainDeleteQueue(ctx, p.queueDir); err != nil {
				p.log.Error("delete queue", zap.Error(err))
			}
		}
	}
}
