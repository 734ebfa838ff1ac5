package endpoint

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/types"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
)

// GC reclaims, for inv's network only, every attachment not in valid, then
// every host veth and netns pin no record claims.
func (m *Manager) GC(ctx context.Context, inv *request.Invocation, valid []types.GCAttachment) error {
	keep := make(map[types.GCAttachment]bool, len(valid))
	for _, a := range valid {
		keep[a] = true
	}
	eps, err := m.cfg.Store.List(inv.Key.Network)
	if err != nil {
		return internalError("%v", err)
	}
	var errs []error
	for _, ep := range eps {
		if keep[types.GCAttachment{ContainerID: ep.ContainerID, IfName: ep.IfName}] {
			continue
		}
		m.log(ctx).Info("GC: reclaiming stale attachment", zap.String("endpoint", ep.Key.String()), zap.String("containerID", ep.ContainerID))
		if err := m.del(ctx, ep.Key, &ep.Generation); err != nil {
			errs = append(errs, err)
		}
	}
	if err := m.ReclaimOrphans(ctx); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return internalError("GC: %v", errors.Join(errs...))
	}
	return nil
}

// ReclaimOrphans removes host veths and netns pins that no endpoint record
// names: what a crash between kernel changes and their record can leave.
// A candidate is removed only under the lock of its name (the lock of the
// attachment it would belong to), after the store is read again: an ADD
// holds that lock from before it creates anything until its record is
// durable (the record commits alongside the kernel work), and a DEL and ADD
// of that attachment (a container restart) between the first read and the
// removal made it live again.
func (m *Manager) ReclaimOrphans(ctx context.Context) error {
	links, err := m.cfg.Network.ListHostVeths()
	if err != nil {
		return fmt.Errorf("list host veths: %w", err)
	}
	pins, err := m.cfg.Network.ListPins(m.cfg.PinDir)
	if err != nil {
		return fmt.Errorf("list netns pins: %w", err)
	}
	testHook(sweepKernelListed)
	claimed, err := m.claimedNames()
	if err != nil {
		return err
	}
	var candidates []orphan
	for _, l := range links {
		if !claimed["link:"+l] {
			candidates = append(candidates, orphan{name: l, link: true})
		}
	}
	for _, p := range pins {
		if !claimed["pin:"+p] {
			candidates = append(candidates, orphan{name: filepath.Base(p), pin: p})
		}
	}
	testHook(sweepOrphansFound)
	var errs []error
	for _, o := range candidates {
		if err := m.reclaimOrphan(ctx, o); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// orphan is a host veth (link) or a netns pin (pin path) no record claimed.
type orphan struct {
	name string // the host interface name; a pin file carries it too
	link bool
	pin  string
}

// sweepStage names the points of the orphan sweep where tests make a
// concurrent DEL or ADD land deterministically.
type sweepStage int

const (
	sweepKernelListed sweepStage = iota // veths and pins listed, store not yet read
	sweepOrphansFound                   // candidates chosen, nothing removed yet
)

// testHookSweep is nil outside tests.
var testHookSweep func(sweepStage)

func testHook(s sweepStage) {
	if testHookSweep != nil {
		testHookSweep(s)
	}
}

func (m *Manager) reclaimOrphan(ctx context.Context, o orphan) error {
	unlock := m.locks.lockName(o.name)
	defer unlock()
	claimed, err := m.claimedNames()
	if err != nil {
		return err
	}
	if o.link && !claimed["link:"+o.name] {
		m.log(ctx).Info("removing orphan host veth", zap.String("link", o.name))
		return m.cfg.Network.TeardownPod(o.name)
	}
	if o.pin != "" && !claimed["pin:"+o.pin] {
		m.log(ctx).Info("removing orphan netns pin", zap.String("pin", o.pin))
		return m.unpin(o.pin)
	}
	return nil
}

// claimedNames returns the host veths ("link:<name>") and pins ("pin:<path>")
// that stored primary-mode endpoints name.
func (m *Manager) claimedNames() (map[string]bool, error) {
	eps, err := m.cfg.Store.List("")
	if err != nil {
		return nil, err
	}
	claimed := map[string]bool{}
	for _, ep := range eps {
		if ep.Mode == store.ModePrimary {
			claimed["link:"+ep.HostIfName] = true
			claimed["pin:"+ep.PinPath] = true
		}
	}
	return claimed, nil
}

// Status says whether the node can serve ADDs. Only lasting reasons fail it
// (no serving block for a family, datapath capacity): the runtime then marks
// the whole node's network not ready. Full blocks do not: they are transient
// (the controller tops the node up), and ADD answers them itself with a
// retryable "try again later" while other pods keep being served.
func (m *Manager) Status(ctx context.Context) error {
	if m.cfg.Datapath != nil {
		if err := m.cfg.Datapath.AttachCapacity(); err != nil {
			return types.NewError(types.ErrPluginNotAvailable, "coordino cannot attach pods: "+err.Error(), "")
		}
	}
	if m.cfg.Pool.Empty() {
		return nil // chained-only node: nothing to allocate, always ready
	}
	if ok, why := m.cfg.Pool.CanServe(); !ok {
		return types.NewError(types.ErrPluginNotAvailable, "coordino cannot attach pods: "+why, "")
	}
	return nil
}
