package daemon

import (
	"context"
	"fmt"
	"net/netip"

	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/controlplane"
	"github.com/coordino/coordino/daemon/endpoint"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/k8s"
	"github.com/coordino/coordino/daemon/metrics"
	"github.com/coordino/coordino/daemon/nodeaddrs"
	"github.com/coordino/coordino/daemon/store"
)

// The source both supplies pod labels and re-checks each attached
// endpoint's identity (endpoint.AttachObserver).
var _ interface {
	endpoint.PodLabeler
	endpoint.AttachObserver
} = (*k8s.Source)(nil)

// newKubernetesSource builds the Kubernetes source; nil in standalone mode.
func newKubernetesSource(o *config.Options, pool *ipam.Pool, m *metrics.Metrics, log *zap.Logger, xn *crossNode) (*k8s.Source, error) {
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
			ips, err := nodeaddrs.List()
			if err != nil {
				return nil
			}
			return ips
		},
		WireGuard: xn.wireGuardStatus,
		BGP:       xn.bgpStatus,
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
func runSource[S controlplane.Sink](ctx context.Context, src controlplane.Source[S], sink S, log *zap.Logger) error {
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

// localPublisher is what publishing this node's endpoints needs of the
// datapath: their identities, and a signal when they change.
type localPublisher interface {
	SetLocalChangeHook(func())
	LocalIdentities() map[string]identity.ID
}

// publishEndpoints makes the Kubernetes source publish this node's
// endpoints (addresses from the store, identities as the datapath enforces
// them) in its NodeEndpoints, again after every attach and detach. Without
// a datapath there are no identities, and nothing is published.

func publishEndpoints(ctx context.Context, kube *k8s.Source, st *store.Store, dp localPublisher) {
	if kube == nil || dp == nil {
		return
	}
	dp.SetLocalChangeHook(kube.PublishEndpoints)
	kube.SetLocalEndpoints(ctx, func() ([]k8s.LocalEndpoint, error) {
		ids := dp.LocalIdentities()
		eps, err := st.List("")
		if err != nil {
			return nil, err
		}
		out := make([]k8s.LocalEndpoint, 0, len(eps))
		for _, ep := range eps {
			id, ok := ids[ep.Key.String()]
			if !ok {
				continue
			}
			le := k8s.LocalEndpoint{PodNamespace: ep.PodNamespace, PodName: ep.PodName, Identity: id}
			for _, p := range ep.IPs {
				le.Addresses = append(le.Addresses, p.Addr())
			}
			out = append(out, le)
		}
		return out, nil
	})
}
