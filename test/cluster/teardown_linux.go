package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/coordino/coordino/test/testbed"
)

// stopOrder: kubelets first (they would restart pods), then what pods
// need, the control plane, and the namespace holders last.
var stopOrder = []string{"-kubelet", "-kube-proxy", "-containerd", "-kube-scheduler", "-kube-controller-manager", "-kube-apiserver", "-etcd", "-holder"}

func stopRank(pidFile string) int {
	base := strings.TrimSuffix(filepath.Base(pidFile), ".pid")
	for i, s := range stopOrder {
		if strings.HasSuffix(base, s) {
			return i
		}
	}
	return len(stopOrder)
}

// Teardown undoes everything a cluster rooted at dir may have left; safe on
// a missing or half-built directory and after the creating process was
// killed. logf may be nil.
func Teardown(dir string, logf func(string, ...any)) error {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var st state
	if b, err := os.ReadFile(filepath.Join(dir, "state.json")); err == nil {
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("%s/state.json: %w", dir, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var errs []error
	pids, _ := filepath.Glob(filepath.Join(dir, "pids", "*.pid"))
	sort.SliceStable(pids, func(i, j int) bool { return stopRank(pids[i]) < stopRank(pids[j]) })
	podsGone := false
	for _, p := range pids {
		if !podsGone && stopRank(p) >= 2 {
			// Kubelets are down: the pods' shims and processes go before
			// containerd, so nothing is re-parented with no one to reap it.
			socks, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "containerd.sock"))
			for _, s := range socks {
				testbed.KillShims(s)
			}
			if st.CgroupRoot != "" {
				if err := testbed.RemoveCgroupTree(st.CgroupRoot); err != nil {
					errs = append(errs, err)
				}
			}
			podsGone = true
		}
		logf("teardown: stopping %s", filepath.Base(p))
		if err := testbed.KillRecorded(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if !podsGone && st.CgroupRoot != "" {
		if err := testbed.RemoveCgroupTree(st.CgroupRoot); err != nil {
			errs = append(errs, err)
		}
	}
	// The host's end first: deleting the underlay namespace removes it
	// too, but asynchronously.
	if st.HostLink != "" {
		if l, err := netlink.LinkByName(st.HostLink); err == nil {
			logf("teardown: deleting link %s", st.HostLink)
			if err := netlink.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("delete link %s: %w", st.HostLink, err))
			}
		}
	}
	// With every holder gone the machines' mount namespaces are gone, and
	// with them their bind mounts, bpffs and the pods' netns pins.
	for _, n := range st.Netns {
		if _, err := os.Stat(filepath.Join("/run/netns", n)); err != nil {
			continue
		}
		logf("teardown: deleting netns %s", n)
		if err := netns.DeleteNamed(n); err != nil {
			errs = append(errs, fmt.Errorf("delete netns %s: %w", n, err))
		}
	}
	if err := testbed.UnmountUnder(dir); err != nil {
		errs = append(errs, err)
	}
	for _, mp := range st.MountPoints {
		if err := removeEmptyTree(mp); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeEmptyTree removes root and the empty directories below it (rmdir
// only): a mount point the cluster created on the host holds nothing of the
// cluster's (the machines' bind mounts do), and anything someone else put
// there since stays.
func removeEmptyTree(root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return filepath.SkipAll
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ENOTEMPTY) {
			return fmt.Errorf("rmdir %s: %w", d, err)
		}
	}
	return nil
}
