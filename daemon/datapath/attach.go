package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Legacy cls_bpf filters use a fixed priority and handle, so Coordino only
// ever replaces or deletes its own filter among others on the same hook.
const (
	legacyPriority = 1
	legacyHandle   = 0xc0d1
)

// linkDir is where an endpoint's tcx links are pinned. bpffs names may not
// contain dots and keys may, so the directory is named by a hash of the key.
func (d *Datapath) linkDir(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(d.cfg.BPFDir, "links", hex.EncodeToString(sum[:16]))
}

// hooks pairs each program with its attach point on the host interface.
func (d *Datapath) hooks() []struct {
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
		{"from_ep", d.objs.CdoFromEp, ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS},
		{"to_ep", d.objs.CdoToEp, ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS},
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
func (d *Datapath) newMode() string {
	if d.cfg.AttachMode == AttachTCX {
		return modeTCX
	}
	return modeLegacy
}

// attach attaches both programs to r's host interface with r.Mode, or with
// the configured mode when r.Mode is empty (a record written before modes
// were recorded up front).
func (d *Datapath) attach(r *record) error {
	if r.Mode == "" {
		r.Mode = d.newMode()
	}
	if r.Mode == modeTCX {
		err := d.attachTCX(r)
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return err
		}
		d.log.Info("tcx not supported by this kernel, using clsact + cls_bpf")
		r.Mode = modeLegacy
	}
	return d.attachLegacy(r)
}

// attachTCX creates and pins one tcx link per direction, or updates pinned
// links to the current programs (re-attach and restart adoption). Each tcx
// attach waits for an RCU grace period in the kernel; the two directions are
// attached concurrently so the waits overlap.
func (d *Datapath) attachTCX(r *record) error {
	dir := d.linkDir(r.Key)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("endpoint %q: create link dir: %w", r.Key, err)
	}
	hooks := d.hooks()
	errs := make([]error, len(hooks))
	var wg sync.WaitGroup
	for i, h := range hooks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.attachTCXHook(r, filepath.Join(dir, h.name), h.name, h.prog, h.tcx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (d *Datapath) attachTCXHook(r *record, pin, name string, prog *ebpf.Program, at ebpf.AttachType) error {
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		err = l.Update(prog)
		l.Close()
		if err == nil {
			return nil
		}
		// A link whose interface is gone cannot be updated: replace it.
		d.log.Sugar().Infof("endpoint %q: replacing stale %s link: %v", r.Key, name, err)
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

func (d *Datapath) attachLegacy(r *record) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: r.HostIfIndex,
			Handle:    netlink.MakeHandle(0xffff, 0),
			Parent:    netlink.HANDLE_CLSACT,
		},
		QdiscType: "clsact",
	}
	// Add, not replace: an existing clsact may carry other filters.
	if err := d.tc.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("endpoint %q: add clsact qdisc to ifindex %d: %w", r.Key, r.HostIfIndex, err)
	}
	for _, h := range d.hooks() {
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
		if err := d.tc.FilterReplace(f); err != nil {
			return fmt.Errorf("endpoint %q: attach cls_bpf %s to ifindex %d: %w", r.Key, h.name, r.HostIfIndex, err)
		}
	}
	return nil
}

// detach removes r's programs; missing links, filters or interfaces are fine.
func (d *Datapath) detach(r *record) error {
	var errs []error
	if r.Mode == modeLegacy {
		for _, h := range d.hooks() {
			f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{
				LinkIndex: r.HostIfIndex, Parent: h.parent, Handle: legacyHandle,
				Protocol: unix.ETH_P_ALL, Priority: legacyPriority,
			}}
			if err := d.tc.FilterDel(f); err != nil && !gone(err) {
				errs = append(errs, fmt.Errorf("endpoint %q: delete cls_bpf %s: %w", r.Key, h.name, err))
			}
		}
	}
	// tcx pins may exist whatever the mode (e.g. a fallback mid-attach).
	if err := d.unpinLinks(r.Key); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// unpinLinks unpins and closes an endpoint's tcx links, detaching them.
func (d *Datapath) unpinLinks(key string) error {
	dir := d.linkDir(key)
	for _, h := range d.hooks() {
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
