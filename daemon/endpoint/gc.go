package endpoint

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/netns"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
)

// GC reclaims, for inv's network only, every attachment not in valid, then
// every host veth and netns pin no record claims.
func (m *Manager) GC(inv *request.Invocation, valid []types.GCAttachment) error {
	keep := make(map[types.GCAttachment]bool, len(valid))
	for _, a := range valid {
		keep[a] = true
	}
	eps, err := m.Store.List(inv.Key.Network)
	if err != nil {
		return internalError("%v", err)
	}
	var errs []error
	for _, ep := range eps {
		if keep[types.GCAttachment{ContainerID: ep.ContainerID, IfName: ep.IfName}] {
			continue
		}
		m.Log.Info("GC: reclaiming stale attachment", zap.String("endpoint", ep.Key.String()), zap.String("containerID", ep.ContainerID))
		if err := m.del(ep.Key, &ep.Generation); err != nil {
			errs = append(errs, err)
		}
	}
	if err := m.ReclaimOrphans(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return internalError("GC: %v", errors.Join(errs...))
	}
	return nil
}

// ReclaimOrphans removes host veths and netns pins that no endpoint record
// names: what a crash between kernel changes and their record can leave.
// The kernel is listed before the store is read: ADD commits its record
// before creating anything, so everything listed that is still in use is
// claimed by a record read afterwards.
func (m *Manager) ReclaimOrphans() error {
	links, err := netsetup.ListHostIfaces()
	if err != nil {
		return fmt.Errorf("list host veths: %w", err)
	}
	pins, err := netns.ListPins(m.PinDir)
	if err != nil {
		return fmt.Errorf("list netns pins: %w", err)
	}
	eps, err := m.Store.List("")
	if err != nil {
		return err
	}
	claimed := map[string]bool{}
	for _, ep := range eps {
		if ep.Mode == store.ModePrimary {
			claimed["link:"+ep.HostIfName] = true
			claimed["pin:"+ep.PinPath] = true
		}
	}
	var errs []error
	for _, l := range links {
		if !claimed["link:"+l] {
			m.Log.Info("removing orphan host veth", zap.String("link", l))
			if err := netsetup.TeardownPod(l); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, p := range pins {
		if !claimed["pin:"+p] {
			m.Log.Info("removing orphan netns pin", zap.String("pin", p))
			if err := unpin(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Status says whether ADD can be served now.
func (m *Manager) Status() error {
	if m.Pool.Empty() {
		return nil // chained-only node: nothing to allocate, always ready
	}
	if ok, why := m.Pool.CanAllocate(); !ok {
		return types.NewError(types.ErrPluginNotAvailable, "coordino cannot attach pods: "+why, "")
	}
	return nil
}
