package endpoint

import (
	"context"
	"fmt"
	"maps"

	"github.com/containernetworking/cni/pkg/types"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
)

// PodLabeler returns the labels a pod's identity is formed from. It may
// wait briefly for a pod it has not seen yet, never on the network.
type PodLabeler interface {
	PodLabels(ctx context.Context, namespace, name, uid string) (map[string]string, error)
}

// AttachObserver, when the PodLabeler implements it, hears of every
// successful ADD once the endpoint's record is stored and its lock is
// released: a refresh of identities that ran during the ADD did not see
// the endpoint yet, so the observer checks it again.
type AttachObserver interface {
	Attached(namespace string, labels map[string]string)
}

// resolveLabels replaces inv's labels with the PodLabeler's. Without a pod
// name there is nothing to look up; a pod the labeler cannot vouch for gets
// "try again later": attaching it with fewer labels than it has could leave
// it outside a policy meant to isolate it.
func (m *Manager) resolveLabels(ctx context.Context, inv *request.Invocation) error {
	if m.cfg.PodLabels == nil {
		return nil
	}
	if inv.PodName == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_ARGS: K8S_POD_NAME is required in Kubernetes mode (the pod's labels decide its policy)", "")
	}
	labels, err := m.cfg.PodLabels.PodLabels(ctx, inv.PodNamespace, inv.PodName, inv.PodUID)
	if err != nil {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("labels of pod %s/%s: %v", inv.PodNamespace, inv.PodName, err), "")
	}
	inv.Labels = labels
	return nil
}

// RefreshEndpoints lets update look at every stored endpoint, under its
// lock, and re-attaches the datapath of those it reports changed (their
// labels, or the identity their label set maps to). The datapath moves an
// endpoint re-attached on the same interface to its new identity in place:
// its conntrack entries are keyed by addresses and ports, not identities, so
// established connections carry on if the new identity's policy allows them.
func (m *Manager) RefreshEndpoints(update func(ep *store.Endpoint) bool) error {
	eps, err := m.cfg.Store.List("")
	if err != nil {
		return err
	}
	for _, listed := range eps {
		if err := m.refreshEndpoint(listed.Key, update); err != nil {
			m.cfg.Log.Error("refreshing endpoint", zap.String("endpoint", listed.Key.String()), zap.Error(err))
		}
	}
	return nil
}

func (m *Manager) refreshEndpoint(k store.Key, update func(ep *store.Endpoint) bool) error {
	unlock := m.lockKey(k)
	defer unlock()
	ep, err := m.cfg.Store.Get(k)
	if err != nil {
		return nil // deleted meanwhile
	}
	before := maps.Clone(ep.Labels)
	if !update(ep) {
		return nil
	}
	if !maps.Equal(before, ep.Labels) {
		if err := m.cfg.Store.Put(ep); err != nil {
			return err
		}
	}
	if m.cfg.Datapath == nil {
		return nil
	}
	index, _, err := m.cfg.Network.HostInterface(ep.HostIfName)
	if err != nil {
		return fmt.Errorf("host interface %s: %w", ep.HostIfName, err)
	}
	return m.cfg.Datapath.AttachEndpoint(datapathEndpoint(ep, index))
}
