package endpoint

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/datapath/dpapi"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/daemon/tracing"
)

// datapathEndpoint is what the datapath needs to know of an endpoint.
func datapathEndpoint(ep *store.Endpoint, hostIfIndex int) dpapi.Endpoint {
	d := dpapi.Endpoint{
		Key:         ep.Key.String(),
		HostIfName:  ep.HostIfName,
		HostIfIndex: hostIfIndex,
		Namespace:   ep.PodNamespace,
		Labels:      ep.Labels,
	}
	if ep.PodName != "" {
		d.Pod = ep.PodNamespace + "/" + ep.PodName
	}
	for _, p := range ep.IPs {
		d.IPs = append(d.IPs, p.Addr())
	}
	return d
}

// attach attaches the datapath to an ADD's endpoint. The caller checked
// that there is a datapath.
func (m *Manager) attach(ctx context.Context, ep dpapi.Endpoint) error {
	_, span := tracing.Start(ctx, "bpf.attach")
	err := m.cfg.Datapath.AttachEndpoint(ep)
	tracing.End(span, err)
	return err
}

// attachError is the CNI error of a failed datapath attach. A full datapath
// table is a capacity limit that frees as pods leave, like an exhausted
// address block: code 11 (try again later), naming the table and the flag
// to raise.
func attachError(hostIf string, err error) error {
	var full dpapi.FullError
	if errors.As(err, &full) {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("attach datapath to %s: %v", hostIf, full), err.Error())
	}
	return internalError("attach datapath to %s: %v", hostIf, err)
}

// ReconcileDatapath makes the attached datapath state match the store after
// a restart: every stored endpoint is (re)attached — adopting pinned state
// is a no-op for the kernel — and attached endpoints without a record are
// detached. Call it after Restore, with policy synced, before serving.
func (m *Manager) ReconcileDatapath() error {
	if m.cfg.Datapath == nil {
		return nil
	}
	known, err := m.reattachStored()
	if err != nil {
		return err
	}
	return m.detachUnknown(known)
}

// reattachStored attaches the datapath of every stored endpoint and returns
// their keys.
func (m *Manager) reattachStored() (map[string]bool, error) {
	eps, err := m.cfg.Store.List("")
	if err != nil {
		return nil, err
	}
	known := map[string]bool{}
	podMACs, err := m.cfg.Network.PodMACs()
	if err != nil {
		// Re-attached endpoints then keep whatever MACs their records hold.
		m.cfg.Log.Warn("list neighbours: endpoints without recorded MACs stay off host routing", zap.Error(err))
	}
	for _, ep := range eps {
		known[ep.Key.String()] = true
		index, hostMAC, err := m.cfg.Network.HostInterface(ep.HostIfName)
		if err != nil {
			// DEL or GC will release it; nothing to protect without an interface.
			m.cfg.Log.Warn("stored endpoint has no host interface", zap.String("endpoint", ep.Key.String()), zap.String("interface", ep.HostIfName))
			continue
		}
		dpEndpoint := datapathEndpoint(ep, index)
		if ep.Mode == store.ModePrimary {
			// An endpoint attached by a release that did not record the
			// veth's MACs gets host routing from here on too.
			dpEndpoint.HostMAC, dpEndpoint.PodMAC = hostMAC, podMACs[index]
		}
		// One endpoint failing must not keep the node from serving: its
		// pinned state still enforces, and the error is loud.
		if err := m.cfg.Datapath.AttachEndpoint(dpEndpoint); err != nil {
			m.cfg.Log.Error("re-attaching the datapath failed; the endpoint keeps its pinned programs", zap.String("endpoint", ep.Key.String()), zap.Error(err))
		}
	}
	return known, nil
}

// detachUnknown detaches every attached endpoint whose key is not known.
func (m *Manager) detachUnknown(known map[string]bool) error {
	attached, err := m.cfg.Datapath.Endpoints()
	if err != nil {
		return err
	}
	for _, key := range attached {
		if !known[key] {
			m.cfg.Log.Info("detaching datapath of an endpoint with no record", zap.String("endpoint", key))
			if err := m.cfg.Datapath.DetachEndpoint(dpapi.Endpoint{Key: key}); err != nil {
				return fmt.Errorf("detach orphan datapath endpoint %s: %w", key, err)
			}
		}
	}
	return nil
}
