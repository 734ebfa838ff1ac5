package endpoint

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/store"
)

// datapathEndpoint is what the datapath needs to know of an endpoint.
func datapathEndpoint(ep *store.Endpoint, hostIfIndex int) datapath.Endpoint {
	d := datapath.Endpoint{
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

// attachError is the CNI error of a failed datapath attach. A full BPF map
// is a capacity limit that frees as pods leave, like an exhausted address
// block: code 11 (try again later), naming the map and the flag to raise.
func attachError(hostIf string, err error) error {
	var full *datapath.MapFullError
	if errors.As(err, &full) {
		return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("attach datapath to %s: %v", hostIf, full), err.Error())
	}
	return internalError("attach datapath to %s: %v", hostIf, err)
}

// ReconcileDatapath makes the pinned datapath state match the store after a
// restart: every stored endpoint is (re)attached — adopting pinned links is
// a no-op for the kernel — and pinned endpoints without a record are
// detached. Call it after Restore, with policy synced, before serving.
func (m *Manager) ReconcileDatapath() error {
	if m.Datapath == nil {
		return nil
	}
	eps, err := m.Store.List("")
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, ep := range eps {
		known[ep.Key.String()] = true
		link, err := netlink.LinkByName(ep.HostIfName)
		if err != nil {
			// DEL or GC will release it; nothing to protect without an interface.
			m.Log.Warn("stored endpoint has no host interface", zap.String("endpoint", ep.Key.String()), zap.String("interface", ep.HostIfName))
			continue
		}
		// One endpoint failing must not keep the node from serving: its
		// pinned state still enforces, and the error is loud.
		if err := m.Datapath.AttachEndpoint(datapathEndpoint(ep, link.Attrs().Index)); err != nil {
			m.Log.Error("re-attaching the datapath failed; the endpoint keeps its pinned programs", zap.String("endpoint", ep.Key.String()), zap.Error(err))
		}
	}
	pinned, err := m.Datapath.Endpoints()
	if err != nil {
		return err
	}
	for _, key := range pinned {
		if !known[key] {
			m.Log.Info("detaching datapath of an endpoint with no record", zap.String("endpoint", key))
			if err := m.Datapath.DetachEndpoint(datapath.Endpoint{Key: key}); err != nil {
				return fmt.Errorf("detach orphan datapath endpoint %s: %w", key, err)
			}
		}
	}
	return nil
}
