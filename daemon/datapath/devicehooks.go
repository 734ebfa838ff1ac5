package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Device hooks: the node-to-node programs on the node's underlay and tunnel
// devices (node isolation) and host routing's ingress on the VXLAN device.
// They are the attacher's: tcx links pinned under <BPFDir>/links/<dir>, or
// on kernels without tcx cls_bpf filters with a marker pinned in their
// place.

// attachDeviceHook attaches prog to a node device's hook at, pinned at
// <links>/<dir>/<name>; a pinned link already on the interface is re-pointed
// instead.
func (a *attacher) attachDeviceHook(dir, name string, ifindex int, prog *ebpf.Program, at ebpf.AttachType) error {
	pin := filepath.Join(a.links, dir, name)
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		return fmt.Errorf("datapath: device hooks %s: %w", dir, err)
	}
	if !a.tcx {
		return a.attachDeviceHookTC(pin, ifindex, prog, at)
	}
	return attachPinned(pin, ifindex, prog, at)
}

func attachPinned(pin string, ifindex int, prog *ebpf.Program, at ebpf.AttachType) error {
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		info, ierr := l.Info()
		same := ierr == nil && info.TCX() != nil && int(info.TCX().Ifindex) == ifindex
		if same {
			if pi, err := prog.Info(); err == nil {
				if id, ok := pi.ID(); ok && id == info.Program {
					l.Close()
					return nil // already this program: the periodic check is free
				}
			}
			if l.Update(prog) == nil {
				l.Close()
				return nil
			}
		}
		_ = l.Unpin()
		l.Close()
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at, Anchor: link.Head()})
	if err != nil {
		return fmt.Errorf("datapath: attach node isolation to ifindex %d: %w", ifindex, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("datapath: pin node isolation link: %w", err)
	}
	return nil
}

// pruneDeviceHooks is PruneDeviceHooks.
func (a *attacher) pruneDeviceHooks(keepTunnel string) error {
	dir := a.links
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("datapath: list device hooks: %w", err)
	}
	var errs []error
	for _, e := range entries {
		name := e.Name()
		tunnel := strings.HasPrefix(name, "tunnel-")
		if !e.IsDir() || !tunnel && !strings.HasPrefix(name, "node-") {
			continue
		}
		hooks := filepath.Join(dir, name)
		if tunnel && name != "tunnel-"+keepTunnel || !hooksAttached(hooks) {
			if err := a.removeHooks(hooks); err != nil {
				errs = append(errs, fmt.Errorf("datapath: remove device hooks %s: %w", name, err))
			} else {
				a.log.Info("device hooks removed", zap.String("hooks", name))
			}
		}
	}
	return errors.Join(errs...)
}

// Kernels without tcx (before 6.6) get the device hooks as cls_bpf
// filters, first on their clsact hook (priority 1). Each leaves a marker
// where its link would be pinned, "<hook>-tc-<ifindex>" (bpffs holds only
// BPF objects and no dots: the marker is its program, pinned), so pruning finds and
// removes them as it does links.
const (
	nodeTCHandle = 0xc0d2
	tcMarker     = "-tc-"
)

// attachDeviceHookTC attaches prog as a cls_bpf filter; a replace swaps the
// program atomically, so re-attaching after a restart has no gap. A filter
// already running prog is left alone: the periodic check costs a dump.
func (a *attacher) attachDeviceHookTC(pin string, ifindex int, prog *ebpf.Program, at ebpf.AttachType) error {
	qdisc := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := a.tc.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("datapath: add clsact qdisc to ifindex %d: %w", ifindex, err)
	}
	info, err := prog.Info()
	if err != nil {
		return fmt.Errorf("datapath: device hook program: %w", err)
	}
	id, ok := info.ID()
	if !ok {
		return fmt.Errorf("datapath: device hook %s: program has no ID", info.Name)
	}
	f := nodeFilter(ifindex, at)
	if !a.tcFilterRuns(f, id) {
		f.Fd, f.Name, f.DirectAction = prog.FD(), info.Name, true
		if err := a.tc.FilterReplace(f); err != nil {
			return fmt.Errorf("datapath: attach cls_bpf %s to ifindex %d: %w", info.Name, ifindex, err)
		}
	}
	return pinMarker(pin+tcMarker+strconv.Itoa(ifindex), id)
}

// tcFilterRuns reports whether the cls_bpf filter f is in place running
// program id.
func (a *attacher) tcFilterRuns(f *netlink.BpfFilter, id ebpf.ProgramID) bool {
	l, err := a.tc.LinkByIndex(f.LinkIndex)
	if err != nil {
		return false
	}
	filters, err := a.tc.FilterList(l, f.Parent)
	if err != nil {
		return false
	}
	for _, got := range filters {
		if b, ok := got.(*netlink.BpfFilter); ok && b.Handle == f.Handle && b.Priority == f.Priority && ebpf.ProgramID(b.Id) == id {
			return true
		}
	}
	return false
}

// pinMarker pins program id at path (a second reference to it, so the
// loader's own pins stay as they are), replacing a marker of another
// program, which it would keep loaded.
func pinMarker(path string, id ebpf.ProgramID) error {
	if old, err := ebpf.LoadPinnedProgram(path, nil); err == nil {
		info, err := old.Info()
		old.Close()
		if err == nil {
			if oldID, ok := info.ID(); ok && oldID == id {
				return nil
			}
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("datapath: record device hook %s: %w", path, err)
		}
	}
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return fmt.Errorf("datapath: record device hook %s: %w", path, err)
	}
	defer p.Close()
	if err := p.Pin(path); err != nil {
		return fmt.Errorf("datapath: record device hook %s: %w", path, err)
	}
	return nil
}

// nodeFilter is the cls_bpf filter of a device hook on ifindex.
func nodeFilter(ifindex int, at ebpf.AttachType) *netlink.BpfFilter {
	parent := uint32(netlink.HANDLE_MIN_INGRESS)
	if at == ebpf.AttachTCXEgress {
		parent = netlink.HANDLE_MIN_EGRESS
	}
	return &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: parent,
		Handle: nodeTCHandle, Protocol: unix.ETH_P_ALL, Priority: legacyPriority}}
}

// tcMarker splits a cls_bpf hook's marker name into hook and interface
// index; ok is false for any other name.
func parseTCMarker(name string) (hook string, ifindex int, ok bool) {
	hook, idx, ok := strings.Cut(name, tcMarker)
	if !ok {
		return "", 0, false
	}
	ifindex, err := strconv.Atoi(idx)
	return hook, ifindex, err == nil
}

// removeHooks detaches and unpins the links pinned in dir (and deletes
// the cls_bpf filters its markers name), then removes it. Detached
// explicitly: the last reference going away releases a link only later,
// from a kernel work queue.
func (a *attacher) removeHooks(dir string) error {
	pins, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, p := range pins {
		pin := filepath.Join(dir, p.Name())
		if hook, ifindex, ok := parseTCMarker(p.Name()); ok {
			at := ebpf.AttachTCXIngress
			if hook == "egress" {
				at = ebpf.AttachTCXEgress
			}
			if err := a.tc.FilterDel(nodeFilter(ifindex, at)); err != nil && !gone(err) {
				return err
			}
		} else if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			_ = l.Detach() // best effort: the unpin below releases it anyway, later
			l.Close()
		}
		if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return os.Remove(dir)
}

// hooksAttached reports whether every tcx link pinned in dir is still
// attached to an interface.
func hooksAttached(dir string) bool {
	pins, err := os.ReadDir(dir)
	if err != nil {
		return true // unreadable: leave it to the next pass
	}
	for _, p := range pins {
		if _, ifindex, ok := parseTCMarker(p.Name()); ok {
			// A filter goes with its interface; a new one of the same
			// name has another index.
			if _, err := netlink.LinkByIndex(ifindex); err != nil {
				return false
			}
			continue
		}
		l, err := link.LoadPinnedLink(filepath.Join(dir, p.Name()), nil)
		if err != nil {
			return false
		}
		info, err := l.Info()
		l.Close()
		if err != nil || info.TCX() == nil || info.TCX().Ifindex == 0 {
			return false
		}
	}
	return true
}
