package endpoint

import (
	"errors"
	"fmt"
	"net"

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
	podMACs := podMACsByHostIf(m.Log)
	for _, ep := range eps {
		known[ep.Key.String()] = true
		link, err := netlink.LinkByName(ep.HostIfName)
		if err != nil {
			// DEL or GC will release it; nothing to protect without an interface.
			m.Log.Warn("stored endpoint has no host interface", zap.String("endpoint", ep.Key.String()), zap.String("interface", ep.HostIfName))
			continue
		}
		dpEndpoint := datapathEndpoint(ep, link.Attrs().Index)
		if ep.Mode == store.ModePrimary {
			// An endpoint attached by a release that did not record the
			// veth's MACs gets host routing from here on too.
			dpEndpoint.HostMAC, dpEndpoint.PodMAC = link.Attrs().HardwareAddr, podMACs[link.Attrs().Index]
		}
		// One endpoint failing must not keep the node from serving: its
		// pinned state still enforces, and the error is loud.
		if err := m.Datapath.AttachEndpoint(dpEndpoint); err != nil {
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

// podMACsByHostIf reads the pod MAC of every primary veth from the host's
// permanent neighbour entries (netsetup writes one per pod address on the
// host end): one dump for the whole reconcile. Nil on error: re-attached
// endpoints then keep whatever MACs their records hold.
func podMACsByHostIf(log *zap.Logger) map[int]net.HardwareAddr {
	neighs, err := netlink.NeighList(0, netlink.FAMILY_ALL)
	if err != nil {
		log.Warn("list neighbours: endpoints without recorded MACs stay off host routing", zap.Error(err))
		return nil
	}
	out := map[int]net.HardwareAddr{}
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT != 0 && len(n.HardwareAddr) == 6 {
			out[n.LinkIndex] = n.HardwareAddr
		}
	}
	return out
}
