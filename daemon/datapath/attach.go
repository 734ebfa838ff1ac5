package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Legacy cls_bpf filters use a fixed priority and handle, so Coordino only
// ever replaces or deletes its own filter among others on the same hook.
const (
	legacyPriority = 1
	legacyHandle   = 0xc0d1
)

// attacher puts the endpoint programs on the host side of endpoints (tcx
// links or clsact + cls_bpf), and the node-to-node and tunnel programs on
// the node's devices, pinning what must outlive the daemon under
// <BPFDir>/links. It also publishes which endpoint each interface is, for
// the flow reader. Its methods take no lock of the datapath: the kernel
// calls are slow and run outside it.
type attacher struct {
	links string // <BPFDir>/links
	mode  AttachMode
	// tcx: the kernel has tcx links; device hooks fall back to cls_bpf
	// filters where it has not.
	tcx bool
	// fromEp and toEp are the endpoint programs.
	fromEp, toEp *ebpf.Program
	// tc is one rtnetlink socket, in the namespace Open ran in, for the
	// qdisc and filter requests of every attach and detach: opening a
	// socket per request cost more than the request itself.
	tc  *netlink.Handle
	log *zap.Logger
	// ifKeys maps host ifindex to endpoint key for the flow reader: a
	// snapshot replaced on every endpoint change, so decoding an event
	// never takes the datapath's lock.
	ifKeys atomic.Pointer[map[uint32]string]
}

func newAttacher(bpfDir string, mode AttachMode, tcx bool, fromEp, toEp *ebpf.Program, log *zap.Logger) (*attacher, error) {
	a := &attacher{links: filepath.Join(bpfDir, "links"), mode: mode, tcx: tcx, fromEp: fromEp, toEp: toEp, log: log}
	var err error
	if a.tc, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return nil, fmt.Errorf("datapath: rtnetlink socket: %w", err)
	}
	a.ifKeys.Store(&map[uint32]string{})
	return a, nil
}

func (a *attacher) close() { a.tc.Close() }

// publish replaces the ifindex→key snapshot with eps'.
func (a *attacher) publish(eps map[string]*record) {
	m := make(map[uint32]string, len(eps))
	for _, r := range eps {
		m[uint32(r.HostIfIndex)] = r.Key
	}
	a.ifKeys.Store(&m)
}

// endpointKey is the key of the endpoint on ifindex ("" if none).
func (a *attacher) endpointKey(ifindex uint32) string {
	if m := a.ifKeys.Load(); m != nil {
		return (*m)[ifindex]
	}
	return ""
}

// linkDir is where an endpoint's tcx links are pinned. bpffs names may not
// contain dots and keys may, so the directory is named by a hash of the key.
func (a *attacher) linkDir(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(a.links, hex.EncodeToString(sum[:16]))
}

// hooks pairs each program with its attach point on the host interface.
func (a *attacher) hooks() []struct {
	name   string
	prog   *ebpf.Program
	tcx    ebpf.AttachType
	parent uint32
} {
	return []struct {
		name   string
		prog   *ebpf.Program
		tcx    ebpf.AttachType
		parent uint32
	}{
		{"from_ep", a.fromEp, ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS},
		{"to_ep", a.toEp, ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS},
	}
}

// AttachMode is how endpoint programs are attached.
type AttachMode string

const (
	// AttachTC uses a clsact qdisc with cls_bpf filters: the default. Attaching
	// takes ~0.3 ms, where a tcx attach waits for an RCU grace period while
	// holding RTNL (7-25 ms measured here, per hook), which would dominate
	// pod creation and serialise every other netlink user on the node.
	AttachTC AttachMode = "tc"
	// AttachTCX uses tcx links (kernel 6.6+), pinned under the BPF dir,
	// falling back to AttachTC where the kernel lacks tcx.
	AttachTCX AttachMode = "tcx"
)

// newMode is the recorded attach mode of a new endpoint.
func (a *attacher) newMode() string {
	if a.mode == AttachTCX {
		return modeTCX
	}
	return modeLegacy
}

// attach attaches both programs to r's host interface with r.Mode, or with
// the configured mode when r.Mode is empty (a record written before modes
// were recorded up front).
func (a *attacher) attach(r *record) error {
	if r.Mode == "" {
		r.Mode = a.newMode()
	}
	if r.Mode == modeTCX {
		err := a.attachTCX(r)
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return err
		}
		a.log.Info("tcx not supported by this kernel, using clsact + cls_bpf")
		r.Mode = modeLegacy
	}
	return a.attachLegacy(r)
}

// attachTCX creates and pins one tcx link per direction, or updates pinned
// links to the current programs (re-attach and restart adoption). Each tcx
// attach waits for an RCU grace period in the kernel; the two directions are
// attached concurrently so the waits overlap.
func (a *attacher) attachTCX(r *record) error {
	dir := a.linkDir(r.Key)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("endpoint %q: create link dir: %w", r.Key, err)
	}
	hooks := a.hooks()
	errs := make([]error, len(hooks))
	var wg sync.WaitGroup
	for i, h := range hooks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = a.attachTCXHook(r, filepath.Join(dir, h.name), h.name, h.prog, h.tcx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (a *attacher) attachTCXHook(r *record, pin, name string, prog *ebpf.Program, at ebpf.AttachType) error {
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		err = l.Update(prog)
		l.Close()
		if err == nil {
			return nil
		}
		// A link whose interface is gone cannot be updated: replace it.
		a.log.Sugar().Infof("endpoint %q: replacing stale %s link: %v", r.Key, name, err)
		_ = os.Remove(pin)
	}
	l, err := link.AttachTCX(link.TCXOptions{
		Interface: r.HostIfIndex,
		Program:   prog,
		Attach:    at,
		// Run before other programs on the hook so policy sees every packet.
		Anchor: link.Head(),
	})
	if err != nil {
		return fmt.Errorf("endpoint %q: attach %s to ifindex %d: %w", r.Key, name, r.HostIfIndex, err)
	}
	err = l.Pin(pin)
	l.Close()
	if err != nil {
		return fmt.Errorf("endpoint %q: pin %s link: %w", r.Key, name, err)
	}
	return nil
}

func (a *attacher) attachLegacy(r *record) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: r.HostIfIndex,
			Handle:    netlink.MakeHandle(0xffff, 0),
			Parent:    netlink.HANDLE_CLSACT,
		},
		QdiscType: "clsact",
	}
	// Add, not replace: an existing clsact may carry other filters.
	if err := a.tc.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("endpoint %q: add clsact qdisc to ifindex %d: %w", r.Key, r.HostIfIndex, err)
	}
	for _, h := range a.hooks() {
		f := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: r.HostIfIndex,
				Parent:    h.parent,
				Handle:    legacyHandle,
				Protocol:  unix.ETH_P_ALL,
				Priority:  legacyPriority,
			},
			Fd:           h.prog.FD(),
			Name:         "cdo_" + h.name,
			DirectAction: true,
		}
		// Replace swaps the program atomically, so re-attach has no gap.
		if err := a.tc.FilterReplace(f); err != nil {
			return fmt.Errorf("endpoint %q: attach cls_bpf %s to ifindex %d: %w", r.Key, h.name, r.HostIfIndex, err)
		}
	}
	return nil
}

// detach removes r's programs; missing links, filters or interfaces are fine.
func (a *attacher) detach(r *record) error {
	var errs []error
	if r.Mode == modeLegacy {
		for _, h := range a.hooks() {
			f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{
				LinkIndex: r.HostIfIndex, Parent: h.parent, Handle: legacyHandle,
				Protocol: unix.ETH_P_ALL, Priority: legacyPriority,
			}}
			if err := a.tc.FilterDel(f); err != nil && !gone(err) {
				errs = append(errs, fmt.Errorf("endpoint %q: delete cls_bpf %s: %w", r.Key, h.name, err))
			}
		}
	}
	// tcx pins may exist whatever the mode (e.g. a fallback mid-attach).
	if err := a.unpinLinks(r.Key); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// unpinLinks unpins and closes an endpoint's tcx links, detaching them.
func (a *attacher) unpinLinks(key string) error {
	dir := a.linkDir(key)
	for _, h := range a.hooks() {
		pin := filepath.Join(dir, h.name)
		l, err := link.LoadPinnedLink(pin, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			// Not loadable as a link: drop the pin so it does not linger.
			if rmErr := os.Remove(pin); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
				return fmt.Errorf("endpoint %q: remove %s pin: %w", key, h.name, rmErr)
			}
			continue
		}
		err = l.Unpin()
		l.Close()
		if err != nil {
			return fmt.Errorf("endpoint %q: unpin %s link: %w", key, h.name, err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("endpoint %q: remove link dir: %w", key, err)
	}
	return nil
}

func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EINVAL) ||
		errors.As(err, new(netlink.LinkNotFoundError))
}
