package daemon

import (
	"context"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/flows"
	"github.com/coordino/coordino/daemon/inspect"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/daemon/metrics"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/daemon/tracing"
	"github.com/coordino/coordino/proto/cni/v1/wire"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// startInspect serves the read-only inspection socket for coordinoctl and
// registers the metrics of the same facts (DEL queue, BPF map fill).
func startInspect(ctx context.Context, o *config.Options, st *store.Store, pool *ipam.Pool, dp *datapath.Datapath, enf enforcer, choice datapathChoice, hub *flows.Hub, m *metrics.Metrics, xn *crossNode, masq *masq, features *kernel.Features, logs *inspect.LogRing, log *zap.Logger) (stop func(), err error) {
	queueDir := filepath.Join(o.RunDir, wire.DeleteQueueDir)
	collectors := []prometheus.Collector{metrics.NewDeleteQueueCollector(queueDir)}
	if dp != nil {
		collectors = append(collectors, metrics.NewMapCollector(func() ([]metrics.MapUsage, error) {
			usage, err := dp.MapUsage()
			out := make([]metrics.MapUsage, len(usage))
			for i, u := range usage {
				out[i] = metrics.MapUsage{Name: u.Name, Entries: u.Entries, Capacity: u.Capacity}
			}
			return out, err
		}))
	}
	if err := m.Register(collectors...); err != nil {
		return nil, err
	}
	svc := inspect.New(inspect.Config{
		NodeName:         o.NodeName,
		Standalone:       o.Standalone,
		AttachMode:       o.AttachMode,
		RunDir:           o.RunDir,
		QueueDir:         queueDir,
		Store:            st,
		Pool:             pool,
		Datapath:         dp,
		Policy:           policyView(enf),
		NotEnforced:      notEnforced(enf),
		DatapathKind:     choice.kind,
		DatapathFallback: choice.fallback,
		Hub:              hub,
		CrossNode:        xn.inspect,
		Masquerade:       masq.inspect,
		KernelFeatures: func() []*inspectv1.KernelFeature {
			var out []*inspectv1.KernelFeature
			for _, f := range features.List() {
				out = append(out, &inspectv1.KernelFeature{Name: string(f.Name), Available: f.Available, Detail: f.Detail, Effect: f.Effect})
			}
			return out
		},
		Options: o,
		Logs:    logs,
		Log:     log.Named("inspect"),
	})
	return svc.Serve(ctx)
}

// startTracing exports OpenTelemetry traces of CNI verbs when an OTLP
// endpoint is configured; the returned stop flushes what is queued.
func startTracing(ctx context.Context, o *config.Options, log *zap.Logger) (stop func(), err error) {
	shutdown, err := tracing.Setup(ctx, tracing.Options{
		Endpoint: o.OTLPEndpoint, ServiceName: "coordino-daemon", Version: inspect.Version(), NodeName: o.NodeName,
	})
	if err != nil {
		return nil, err
	}
	if tracing.Enabled() {
		log.Info("exporting traces over OTLP", zap.String("endpoint", o.OTLPEndpoint))
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("flush traces", zap.Error(err))
		}
	}, nil
}

// policyView is what inspect reads of the datapath enforcing policy, nil
// without one (a nil pointer in an interface is not a nil interface).
func policyView(enf enforcer) inspect.PolicyView {
	if v, ok := enf.(inspect.PolicyView); ok && enf != nil {
		return v
	}
	return nil
}

// notEnforced reports what the enforcing datapath leaves out, when it can
// leave something out (nftables).
func notEnforced(enf enforcer) func() string {
	if n, ok := enf.(interface{ NotEnforced() string }); ok && enf != nil {
		return n.NotEnforced
	}
	return nil
}
