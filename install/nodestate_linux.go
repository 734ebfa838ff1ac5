package install

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/masquerade"
	"github.com/coordino/coordino/daemon/netns"
	"github.com/coordino/coordino/daemon/nftdp"
	"github.com/coordino/coordino/daemon/postdnat"
	"github.com/coordino/coordino/daemon/routing"
	"github.com/coordino/coordino/proto/cni/v1/wire"
)

// ourFilterPrefix starts the name of every cls_bpf filter the datapath
// attaches ("cdo_from_ep", "cdo_to_ep"); other CNIs' filters on the same
// hooks are never touched.
const ourFilterPrefix = "cdo_"

// RemoveNodeState takes Coordino's datapath and pins off the node, in the
// network namespace of the caller, in an order that never leaves a pod
// half-enforced (see docs/install.md, "Uninstalling"):
//
//  1. refuse while a daemon answers on the socket;
//  2. per interface, detach both programs back to back: the whole clsact
//     qdisc when it holds only Coordino's filters (one atomic step), else
//     Coordino's two filters; then each endpoint's two tcx link pins;
//  3. remove the nftables post-DNAT stage (older kernels), the nftables
//     datapath's table (--datapath=nftables, or auto's fallback), the
//     masquerade table, the blackhole routes encryption keeps for the other
//     nodes' blocks, and the BPF dir (maps are freed once no program holds
//     them);
//  4. unmount and remove the netns pins (pods keep their namespaces through
//     the runtime's handles);
//  5. remove the rest of the run dir's entries (sockets, the deletion queue:
//     DELs queued for a daemon that will not come back) and, with StateDir,
//     the endpoint store and everything else in the state dir.
//
// It is idempotent; a failed run is finished by the next one.
func RemoveNodeState(s NodeState, log *zap.Logger) error {
	if log == nil {
		log = zap.NewNop()
	}
	sock := filepath.Join(s.RunDir, wire.SocketName)
	if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("%w (%s answers): remove its DaemonSet or stop it first", ErrDaemonRunning, sock)
	}
	if err := detachFilters(log); err != nil {
		return err
	}
	if err := unpinTCXLinks(filepath.Join(s.BPFDir, "links"), log); err != nil {
		return err
	}
	// The nftables post-DNAT stage holds the last reference to its
	// program and, through it, the maps: it goes before the pins.
	if err := postdnat.Remove(); err != nil {
		return err
	}
	if err := nftdp.Remove(); err != nil {
		return err
	}
	// Established masqueraded flows keep their conntrack entries until
	// they end; new ones leave with the pod's address, as before install.
	if err := (&masquerade.Table{}).Remove(); err != nil {
		return err
	}
	// Left behind, they would drop the other nodes' pod blocks for good.
	if err := routing.RemoveBlackholes(log); err != nil {
		return err
	}
	if err := os.RemoveAll(s.BPFDir); err != nil {
		return fmt.Errorf("remove BPF dir %s: %w", s.BPFDir, err)
	}
	pins, err := netns.ListPins(filepath.Join(s.RunDir, "netns"))
	if err != nil {
		return err
	}
	for _, p := range pins {
		if err := netns.Unpin(p); err != nil {
			return err
		}
	}
	if len(pins) > 0 {
		log.Info("removed netns pins", zap.Int("count", len(pins)))
	}
	for _, pattern := range runDirEntries {
		matches, err := filepath.Glob(filepath.Join(s.RunDir, pattern))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return fmt.Errorf("remove %s: %w", m, err)
			}
		}
	}
	if s.StateDir == "" {
		return nil
	}
	ents, err := os.ReadDir(s.StateDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("list state dir %s: %w", s.StateDir, err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(s.StateDir, e.Name())); err != nil {
			return fmt.Errorf("remove %s: %w", filepath.Join(s.StateDir, e.Name()), err)
		}
	}
	if len(ents) > 0 {
		log.Info("removed the daemon's state", zap.String("dir", s.StateDir), zap.Int("entries", len(ents)))
	}
	return nil
}

// detachFilters removes Coordino's cls_bpf filters from every interface.
func detachFilters(log *zap.Logger) error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list interfaces: %w", err)
	}
	var errs []error
	for _, l := range links {
		ours, others, err := bpfFilters(l)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if len(ours) == 0 {
			continue
		}
		if others == 0 {
			// Deleting clsact drops both hooks' filters in one step.
			q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index,
				Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
			if err := netlink.QdiscDel(q); err != nil && !isGone(err) {
				errs = append(errs, fmt.Errorf("remove clsact of %s: %w", l.Attrs().Name, err))
			}
		} else {
			for _, f := range ours {
				if err := netlink.FilterDel(f); err != nil && !isGone(err) {
					errs = append(errs, fmt.Errorf("remove filter %s of %s: %w", f.Name, l.Attrs().Name, err))
				}
			}
		}
		log.Info("detached datapath", zap.String("interface", l.Attrs().Name), zap.Bool("sharedWithOtherFilters", others > 0))
	}
	return errors.Join(errs...)
}

// bpfFilters splits the filters on l's clsact hooks into Coordino's and others.
func bpfFilters(l netlink.Link) (ours []*netlink.BpfFilter, others int, err error) {
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := netlink.FilterList(l, parent)
		if err != nil {
			if isGone(err) {
				continue
			}
			return nil, 0, fmt.Errorf("list filters of %s: %w", l.Attrs().Name, err)
		}
		for _, f := range fs {
			if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, ourFilterPrefix) {
				ours = append(ours, bf)
			} else {
				others++
			}
		}
	}
	return ours, others, nil
}

// unpinTCXLinks removes the pinned tcx links, one endpoint directory at a
// time, so both directions of a pod go together. With the daemon stopped the
// pin is the last reference, and removing it detaches the program.
func unpinTCXLinks(dir string, log *zap.Logger) error {
	eps, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list tcx links in %s: %w", dir, err)
	}
	for _, ep := range eps {
		if err := os.RemoveAll(filepath.Join(dir, ep.Name())); err != nil {
			return fmt.Errorf("unpin tcx links %s: %w", filepath.Join(dir, ep.Name()), err)
		}
	}
	if len(eps) > 0 {
		log.Info("unpinned tcx links", zap.Int("endpoints", len(eps)))
	}
	return nil
}

// isGone reports errors of an interface, qdisc or filter that vanished meanwhile.
func isGone(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.EINVAL) || errors.As(err, &nf)
}
