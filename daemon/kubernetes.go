package daemon

import (
	"context"
	"fmt"
	"net/netip"

	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/controlplane"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/k8s"
	"github.com/coordino/coordino/daemon/metrics"
	"github.com/coordino/coordino/daemon/policy"
)

// newKubernetesSource builds the Kubernetes source; nil in standalone mode.
func newKubernetesSource(o *config.Options, pool *ipam.Pool, m *metrics.Metrics, log *zap.Logger) (*k8s.Source, error) {
	if o.Standalone {
		return nil, nil
	}
	rc, err := k8s.RestConfig(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	src, err := k8s.New(k8s.Config{
		NodeName: o.NodeName,
		Rest:     rc,
		StateDir: o.StateDir,
		Pool:     pool,
		Log:      log,
		NodeAddresses: func() []netip.Addr {
			ips, err := nodeAddresses()
			if err != nil {
				return nil
			}
			return ips
		},
	})
	if err != nil {
		return nil, err
	}
	return src, m.Register(src.Collectors()...)
}

// identityAssigner is the datapath's assigner: the Kubernetes source's, or
// nil (node-local numbering) standalone.
func identityAssigner(src *k8s.Source) identity.Assigner {
	if src == nil {
		return nil
	}
	return src.Identities()
}

// runSource runs src into sink and returns once its first snapshot is
// applied, so no pod is attached before its policy exists.
func runSource(ctx context.Context, src controlplane.Source, sink controlplane.Sink, log *zap.Logger) error {
	failed := make(chan error, 1)
	go func() {
		if err := src.Run(ctx, sink); err != nil {
			log.Error("control-plane source stopped", zap.Error(err))
			failed <- err
		}
	}()
	select {
	case <-src.Synced():
		return nil
	case err := <-failed:
		return fmt.Errorf("control-plane source: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// discardPolicy is the sink without a datapath (--no-datapath).
type discardPolicy struct{}

func (discardPolicy) UpdatePolicy(policy.Snapshot) error { return nil }
