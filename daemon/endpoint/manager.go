package endpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/daemon/tracing"
)

// Config wires a Manager.
type Config struct {
	// PinDir holds the bind mounts that keep pod network namespaces alive.
	PinDir string
	Pool   *ipam.Pool
	Store  *store.Store
	// DefaultMTU is used when the network config sets none (the node's uplink MTU).
	DefaultMTU int
	// Datapath may be nil (--no-datapath): attachments then get connectivity
	// without eBPF policy enforcement.
	Datapath *datapath.Datapath
	// DeleteQueueDir holds the DELs the plugin queued while the daemon was
	// unreachable; an ADD applies those of its key first.
	DeleteQueueDir string
	Log            *zap.Logger
	// PodLabels, when set (Kubernetes mode), is where ADD takes the pod's
	// labels from instead of the network config's args.
	PodLabels PodLabeler
}

// Manager carries out the CNI verbs. Safe for concurrent use.
type Manager struct {
	Config
	locks      keyedMutex
	unrestored unrestored
}

// New returns a Manager. Call Restore before serving.
func New(cfg Config) *Manager {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Manager{Config: cfg}
}

// ResultVersion is the CNI version of results the daemon returns; the plugin
// converts them to the version the runtime asked for.
const ResultVersion = "1.1.0"

// Add attaches a pod and returns the CNI result JSON.
func (m *Manager) Add(inv *request.Invocation) ([]byte, error) {
	if err := m.resolveLabels(inv); err != nil {
		return nil, err
	}
	res, err := m.addLocked(inv)
	if o, ok := m.PodLabels.(AttachObserver); ok && err == nil {
		o.Attached(inv.PodNamespace, inv.Labels)
	}
	return res, err
}

func (m *Manager) addLocked(inv *request.Invocation) ([]byte, error) {
	unlock := m.lockKey(inv.Key)
	defer unlock()

	// A DEL the runtime saw succeed (queued) before it issued this ADD must
	// land on the old attachment, never on the one this ADD creates.
	_, span := tracing.Start(inv.Ctx, "deletequeue.apply")
	err := m.applyQueuedDels(inv.Key)
	tracing.End(span, err)
	if err != nil {
		return nil, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("apply queued DEL of %s first: %v", inv.Key, err), "")
	}

	// A second ADD of the same attachment (a runtime retrying after a
	// timeout) starts from a clean slate rather than failing on leftovers.
	if old, err := m.Store.Get(inv.Key); err == nil {
		m.Log.Info("ADD of an existing attachment: removing the old one first", zap.String("endpoint", inv.Key.String()))
		if err := m.release(old); err != nil {
			return nil, internalError("remove previous attachment %s: %v", inv.Key, err)
		}
	}
	if inv.PrevResult != nil {
		return m.addChained(inv)
	}
	return m.addPrimary(inv)
}

func (m *Manager) newEndpoint(inv *request.Invocation, mode store.Mode) *store.Endpoint {
	return &store.Endpoint{
		Key:          inv.Key,
		Mode:         mode,
		Netns:        inv.Netns,
		PodNamespace: inv.PodNamespace,
		PodName:      inv.PodName,
		PodUID:       inv.PodUID,
		Labels:       inv.Labels,
		Created:      time.Now(),
	}
}

func (m *Manager) addPrimary(inv *request.Invocation) (_ []byte, err error) {
	if err := verifyNetns(inv.Netns); err != nil {
		return nil, err
	}
	_, span := tracing.Start(inv.Ctx, "ipam.allocate")
	ips, err := m.Pool.Allocate()
	tracing.End(span, err)
	if err != nil {
		return nil, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("allocate pod address: %v", err), "")
	}
	ep := m.newEndpoint(inv, store.ModePrimary)
	ep.IPs = ips
	ep.HostIfName = netsetup.HostIfName(inv.Key.Network, inv.Key.ContainerID, inv.Key.IfName)
	ep.PinPath = filepath.Join(m.PinDir, ep.HostIfName)
	ep.MTU = inv.Conf.MTU
	if ep.MTU == 0 {
		ep.MTU = m.DefaultMTU
	}

	// The record commits while the netns is pinned and the veth set up: the
	// commit waits for fsync, the set-up for the kernel, and neither needs
	// the other. A crash before the record is durable can leave a veth, a pin
	// and a datapath endpoint that no record names; all three carry names
	// derived from the key, and the daemon reclaims them when it starts,
	// before it serves (ReclaimOrphans, ReconcileDatapath), as GC does. The
	// addresses are reserved in memory only and come back from the records.
	// The ADD succeeds only once the record is durable and the set-up done.
	dpEndpoint := datapathEndpoint(ep, 0) // before the commit touches ep
	committed := m.commitInBackground(inv, ep)
	defer func() {
		// Waited for even after a failure: the undo must not race the commit.
		if cerr := committed.wait(); cerr != nil && err == nil {
			err = internalError("%v", cerr)
		}
		if err != nil {
			if rerr := m.release(ep); rerr != nil {
				m.Log.Error("undo failed ADD", zap.String("endpoint", ep.Key.String()), zap.Error(rerr))
			}
		}
	}()

	_, span = tracing.Start(inv.Ctx, "netns.pin")
	err = pin(inv.Netns, ep.PinPath)
	tracing.End(span, err)
	if err != nil {
		return nil, err
	}
	setup := netsetup.PodConfig{
		NetNSPath:  ep.PinPath,
		IfName:     inv.Key.IfName,
		HostIfName: ep.HostIfName,
		MTU:        ep.MTU,
		Addrs:      ips,
	}
	var attachErr error
	if m.Datapath != nil {
		// The datapath attaches to the host veth while both ends are being
		// configured; the ADD returns only after both, so policy holds from
		// the pod's first packet.
		setup.WhileConfiguring = func(hostIfIndex int, hostMAC, podMAC net.HardwareAddr) error {
			_, span := tracing.Start(inv.Ctx, "bpf.attach")
			dpEndpoint.HostIfIndex = hostIfIndex
			dpEndpoint.HostMAC, dpEndpoint.PodMAC = hostMAC, podMAC // primary: host routing may deliver to it
			attachErr = m.Datapath.AttachEndpoint(dpEndpoint)
			tracing.End(span, attachErr)
			return attachErr
		}
	}
	_, span = tracing.Start(inv.Ctx, "netlink.setup")
	att, err := netsetup.SetupPod(setup)
	tracing.End(span, err)
	if attachErr != nil {
		return nil, attachError(ep.HostIfName, attachErr)
	}
	if err != nil {
		return nil, internalError("set up pod network: %v", err)
	}
	if cerr := committed.wait(); cerr != nil {
		return nil, internalError("%v", cerr)
	}
	return primaryResult(inv, ep, att)
}

func primaryResult(inv *request.Invocation, ep *store.Endpoint, att *netsetup.Attachment) ([]byte, error) {
	res := &current.Result{
		CNIVersion: ResultVersion,
		Interfaces: []*current.Interface{
			{Name: att.HostIfName, Mac: att.HostMAC.String()},
			{Name: inv.Key.IfName, Mac: att.PodMAC.String(), Mtu: att.MTU, Sandbox: inv.Netns},
		},
		DNS: inv.Conf.DNS,
	}
	for _, p := range ep.IPs {
		gw := netsetup.GatewayV4
		dst := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		if p.Addr().Is6() {
			gw, dst = netsetup.GatewayV6, netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		}
		res.IPs = append(res.IPs, &current.IPConfig{
			Interface: current.Int(1),
			Address:   net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())},
			Gateway:   gw.AsSlice(),
		})
		res.Routes = append(res.Routes, &types.Route{
			Dst: net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(0, dst.Addr().BitLen())},
			GW:  gw.AsSlice(),
		})
	}
	return marshalResult(res)
}

func marshalResult(res *current.Result) ([]byte, error) {
	res.CNIVersion = ResultVersion
	out, err := json.Marshal(res)
	if err != nil {
		return nil, internalError("encode result: %v", err)
	}
	return out, nil
}

// Del detaches a pod. It succeeds for unknown attachments, without netns and
// without prevResult, so a runtime can always finish tearing a pod down.
func (m *Manager) Del(inv *request.Invocation) error {
	return m.del(inv.Key, nil)
}

// del removes the attachment k. With only set, it removes k only while k's
// record has that generation, never a newer attachment of the same key
// (records from before generations existed have generation 0).
func (m *Manager) del(k store.Key, only *uint64) error {
	unlock := m.lockKey(k)
	defer unlock()
	return m.delLocked(k, only)
}

// delLocked is del for a caller that holds k's lock.
func (m *Manager) delLocked(k store.Key, only *uint64) error {
	ep, err := m.Store.Get(k)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return internalError("%v", err)
	}
	if only != nil && ep.Generation != *only {
		return nil
	}
	if err := m.release(ep); err != nil {
		return internalError("%v", err)
	}
	return nil
}

// release undoes everything an attachment holds, kernel state first and the
// record last, so an interrupted release is finished by the next DEL or GC.
// In primary mode the veth goes before the datapath detach: deleting the
// device takes its tcx links with it, which makes the detach cheap.
// The caller holds the attachment's lock.
func (m *Manager) release(ep *store.Endpoint) error {
	var errs []error
	if ep.Mode == store.ModePrimary {
		if err := netsetup.TeardownPod(ep.HostIfName); err != nil {
			errs = append(errs, fmt.Errorf("remove veth %s: %w", ep.HostIfName, err))
		}
	}
	if m.Datapath != nil {
		if err := m.Datapath.DetachEndpoint(datapathEndpoint(ep, 0)); err != nil {
			errs = append(errs, fmt.Errorf("detach datapath: %w", err))
		}
	}
	if ep.Mode == store.ModePrimary && ep.PinPath != "" {
		if err := unpin(ep.PinPath); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("release %s: %w", ep.Key, errors.Join(errs...))
	}
	if err := m.Store.Delete(ep.Key); err != nil {
		return err
	}
	if ep.Mode == store.ModePrimary {
		m.releaseAddresses(ep)
	}
	return nil
}

func internalError(format string, args ...any) error {
	return types.NewError(types.ErrInternal, fmt.Sprintf(format, args...), "")
}
