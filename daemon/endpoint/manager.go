package endpoint

import (
	"context"
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

	"github.com/coordino/coordino/daemon/datapath/dpapi"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/daemon/tracing"
)

// Config wires a Manager. New takes a copy: nothing changes it afterwards.
type Config struct {
	// PinDir holds the bind mounts that keep pod network namespaces alive.
	PinDir string
	Pool   *ipam.Pool
	Store  Store
	// Network is the node's kernel as attachments touch it (Host).
	Network PodNetwork
	// DefaultMTU is used when the network config sets none (the node's uplink MTU).
	DefaultMTU int
	// Datapath may be nil (--no-datapath): attachments then get connectivity
	// without policy enforcement.
	Datapath Datapath
	// DeleteQueueDir holds the DELs the plugin queued while the daemon was
	// unreachable; an ADD applies those of its key first.
	DeleteQueueDir string
	// Log is the manager's logger; a request's own (request.WithLogger)
	// takes its place for what that request does.
	Log *zap.Logger
	// PodLabels, when set (Kubernetes mode), is where ADD takes the pod's
	// labels from instead of the network config's args. If it also is an
	// AttachObserver it hears of every successful ADD.
	PodLabels PodLabeler
	// Chained, when set, hears of the networks of every chained attachment:
	// at its ADD, at Restore, and when it is released.
	Chained ChainedNetworks
}

// Manager carries out the CNI verbs. Safe for concurrent use.
type Manager struct {
	cfg        Config
	locks      keyedMutex
	unrestored unrestored
}

// New returns a Manager. Call Restore before serving.
func New(cfg Config) *Manager {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Manager{cfg: cfg}
}

// log is the logger of the request ctx belongs to, or the manager's.
func (m *Manager) log(ctx context.Context) *zap.Logger {
	return request.Logger(ctx, m.cfg.Log)
}

// ResultVersion is the CNI version of results the daemon returns; the plugin
// converts them to the version the runtime asked for.
const ResultVersion = "1.1.0"

// Add attaches a pod and returns the CNI result JSON.
func (m *Manager) Add(ctx context.Context, inv *request.Invocation) ([]byte, error) {
	if err := m.resolveLabels(ctx, inv); err != nil {
		return nil, err
	}
	res, err := m.addLocked(ctx, inv)
	if o, ok := m.cfg.PodLabels.(AttachObserver); ok && err == nil {
		o.Attached(inv.PodNamespace, inv.Labels)
	}
	return res, err
}

func (m *Manager) addLocked(ctx context.Context, inv *request.Invocation) ([]byte, error) {
	unlock := m.lockKey(inv.Key)
	defer unlock()

	// A DEL the runtime saw succeed (queued) before it issued this ADD must
	// land on the old attachment, never on the one this ADD creates.
	_, span := tracing.Start(ctx, "deletequeue.apply")
	err := m.applyQueuedDels(ctx, inv.Key)
	tracing.End(span, err)
	if err != nil {
		return nil, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("apply queued DEL of %s first: %v", inv.Key, err), "")
	}

	// A second ADD of the same attachment (a runtime retrying after a
	// timeout) starts from a clean slate rather than failing on leftovers.
	if old, err := m.cfg.Store.Get(inv.Key); err == nil {
		m.log(ctx).Info("ADD of an existing attachment: removing the old one first", zap.String("endpoint", inv.Key.String()))
		if err := m.release(old); err != nil {
			return nil, internalError("remove previous attachment %s: %v", inv.Key, err)
		}
	}
	if inv.PrevResult != nil {
		return m.addChained(ctx, inv)
	}
	return m.addPrimary(ctx, inv)
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

// addPrimary creates the pod's interface: the record commits while the
// netns is pinned and the veth set up (with the datapath attaching to it
// meanwhile). The commit waits for fsync, the set-up for the kernel, and
// neither needs the other. A crash before the record is durable can leave a
// veth, a pin and a datapath endpoint that no record names; all three carry
// names derived from the key, and the daemon reclaims them when it starts,
// before it serves (ReclaimOrphans, ReconcileDatapath), as GC does. The
// addresses are reserved in memory only and come back from the records.
// The ADD succeeds only once the record is durable and the set-up done; on
// failure it undoes everything (undoPrimary).
func (m *Manager) addPrimary(ctx context.Context, inv *request.Invocation) (_ []byte, err error) {
	if err := m.verifyNetns(inv.Netns); err != nil {
		return nil, err
	}
	ep, err := m.allocate(ctx, inv)
	if err != nil {
		return nil, err
	}
	dpEndpoint := datapathEndpoint(ep, 0) // before the commit touches ep
	committed := m.commitInBackground(ctx, ep)
	defer func() { err = m.undoPrimary(ctx, ep, committed, err) }()

	if err := m.pin(ctx, inv.Netns, ep.PinPath); err != nil {
		return nil, err
	}
	att, err := m.setupVeth(ctx, ep, dpEndpoint)
	if err != nil {
		return nil, err
	}
	if err := committed.wait(); err != nil {
		return nil, internalError("%v", err)
	}
	return primaryResult(inv, ep, att)
}

// allocate reserves the pod's addresses and describes the attachment to be.
func (m *Manager) allocate(ctx context.Context, inv *request.Invocation) (*store.Endpoint, error) {
	_, span := tracing.Start(ctx, "ipam.allocate")
	ips, err := m.cfg.Pool.Allocate()
	tracing.End(span, err)
	if err != nil {
		return nil, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("allocate pod address: %v", err), "")
	}
	ep := m.newEndpoint(inv, store.ModePrimary)
	ep.IPs = ips
	ep.HostIfName = netsetup.HostIfName(inv.Key.Network, inv.Key.ContainerID, inv.Key.IfName)
	ep.PinPath = filepath.Join(m.cfg.PinDir, ep.HostIfName)
	ep.MTU = inv.Conf.MTU
	if ep.MTU == 0 {
		ep.MTU = m.cfg.DefaultMTU
	}
	return ep, nil
}

// undoPrimary ends a primary ADD whose outcome is err: it waits for the
// record's commit even after a failure, since the undo must not race it,
// and then, if anything failed, releases all the ADD made.
func (m *Manager) undoPrimary(ctx context.Context, ep *store.Endpoint, committed *pendingCommit, err error) error {
	if cerr := committed.wait(); cerr != nil && err == nil {
		err = internalError("%v", cerr)
	}
	if err != nil {
		if rerr := m.release(ep); rerr != nil {
			m.log(ctx).Error("undo failed ADD", zap.String("endpoint", ep.Key.String()), zap.Error(rerr))
		}
	}
	return err
}

// setupVeth creates and configures the veth pair in the pinned namespace.
// The datapath attaches to the host end while both ends are being
// configured (PodConfig.WhileConfiguring); SetupPod returns only after
// both, so policy holds from the pod's first packet.
func (m *Manager) setupVeth(ctx context.Context, ep *store.Endpoint, dpEndpoint dpapi.Endpoint) (*netsetup.Attachment, error) {
	setup := netsetup.PodConfig{
		NetNSPath:  ep.PinPath,
		IfName:     ep.IfName,
		HostIfName: ep.HostIfName,
		MTU:        ep.MTU,
		Addrs:      ep.IPs,
	}
	var attachErr error
	if m.cfg.Datapath != nil {
		setup.WhileConfiguring = func(hostIfIndex int, hostMAC, podMAC net.HardwareAddr) error {
			dpEndpoint.HostIfIndex = hostIfIndex
			dpEndpoint.HostMAC, dpEndpoint.PodMAC = hostMAC, podMAC // primary: host routing may deliver to it
			attachErr = m.attach(ctx, dpEndpoint)
			return attachErr
		}
	}
	_, span := tracing.Start(ctx, "netlink.setup")
	att, err := m.cfg.Network.SetupPod(setup)
	tracing.End(span, err)
	if attachErr != nil {
		return nil, attachError(ep.HostIfName, attachErr)
	}
	if err != nil {
		return nil, internalError("set up pod network: %v", err)
	}
	return att, nil
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
func (m *Manager) Del(ctx context.Context, inv *request.Invocation) error {
	return m.del(ctx, inv.Key, nil)
}

// del removes the attachment k. With only set, it removes k only while k's
// record has that generation, never a newer attachment of the same key
// (records from before generations existed have generation 0).
func (m *Manager) del(ctx context.Context, k store.Key, only *uint64) error {
	unlock := m.lockKey(k)
	defer unlock()
	return m.delLocked(ctx, k, only)
}

// delLocked is del for a caller that holds k's lock.
func (m *Manager) delLocked(ctx context.Context, k store.Key, only *uint64) error {
	ep, err := m.cfg.Store.Get(k)
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
// device takes its attachments with it, which makes the detach cheap.
// The caller holds the attachment's lock.
func (m *Manager) release(ep *store.Endpoint) error {
	var errs []error
	if ep.Mode == store.ModePrimary {
		if err := m.cfg.Network.TeardownPod(ep.HostIfName); err != nil {
			errs = append(errs, fmt.Errorf("remove veth %s: %w", ep.HostIfName, err))
		}
	}
	if m.cfg.Datapath != nil {
		if err := m.cfg.Datapath.DetachEndpoint(datapathEndpoint(ep, 0)); err != nil {
			errs = append(errs, fmt.Errorf("detach datapath: %w", err))
		}
	}
	if ep.Mode == store.ModePrimary && ep.PinPath != "" {
		if err := m.unpin(ep.PinPath); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("release %s: %w", ep.Key, errors.Join(errs...))
	}
	if err := m.cfg.Store.Delete(ep.Key); err != nil {
		return err
	}
	if ep.Mode == store.ModePrimary {
		m.releaseAddresses(ep)
	} else if m.cfg.Chained != nil {
		m.cfg.Chained.ForgetChained(ep.Key.String())
	}
	return nil
}

func internalError(format string, args ...any) error {
	return types.NewError(types.ErrInternal, fmt.Sprintf(format, args...), "")
}
