package testbed

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Sysctls kubelet or the CNI plugins may change on the host; recorded before
// a bed starts and restored by Teardown.
var trackedSysctls = []string{
	"net/ipv4/ip_forward",
	"net/ipv6/conf/all/forwarding",
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// Network names and the bridge device the bed's conflists use; cleanup of
// libcni's cache (/var/lib/cni, not configurable through containerd) is
// limited to these names.
var (
	bedNetworks = []string{NetPrimary, NetChained, NetBridge}
	bedBridge   = "tbbr0"
)

// hostState is what the host looked like before the bed started.
type hostState struct {
	Sysctls map[string]string   `json:"sysctls"`
	Chains  map[string][]string `json:"chains"` // "iptables/filter" -> KUBE-* chains present before
	// RunContainerd: /run/containerd existed. containerd's shims put their
	// sockets under /run/containerd/s whatever the config says; the bed
	// removes the directories afterwards only when it created them.
	RunContainerd bool `json:"runContainerd"`
	// VarLogContainers: kubelet creates /var/log/containers (fixed path).
	VarLogContainers bool `json:"varLogContainers"`
}

var iptablesTables = []string{"filter", "nat", "mangle"}

const (
	shimSocketRoot    = "/run/containerd"
	containerLogLinks = "/var/log/containers"
)

func recordHostState(dir string) error {
	st := hostState{Sysctls: map[string]string{}, Chains: map[string][]string{}}
	for _, s := range trackedSysctls {
		if b, err := os.ReadFile("/proc/sys/" + s); err == nil {
			st.Sysctls[s] = strings.TrimSpace(string(b))
		}
	}
	for _, bin := range []string{"iptables", "ip6tables"} {
		for _, t := range iptablesTables {
			st.Chains[bin+"/"+t] = kubeChains(bin, t)
		}
	}
	if _, err := os.Stat(shimSocketRoot); err == nil {
		st.RunContainerd = true
	}
	if _, err := os.Stat(containerLogLinks); err == nil {
		st.VarLogContainers = true
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "host-state.json"), b, 0o644)
}

// kubeChains lists the KUBE-* chains of a table.
func kubeChains(bin, table string) []string {
	out, err := exec.Command(bin, "-w", "-t", table, "-S").Output()
	if err != nil {
		return nil
	}
	var chains []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "-N" && strings.HasPrefix(f[1], "KUBE-") {
			chains = append(chains, f[1])
		}
	}
	return chains
}

// Teardown undoes everything a bed rooted at dir may have left: it is safe to
// run on a missing or half-torn-down directory and after the test binary was
// killed. logf may be nil.
func Teardown(dir string, logf func(string, ...any)) error {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var errs []error
	// 1. Recorded processes, kubelet first so it does not restart pods.
	pids, _ := filepath.Glob(filepath.Join(dir, "pids", "*.pid"))
	sort.SliceStable(pids, func(i, j int) bool { return stopOrder(pids[i]) < stopOrder(pids[j]) })
	for _, p := range pids {
		logf("teardown: stopping %s", filepath.Base(p))
		if err := killRecorded(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	// 2. Shims our containerd started (they are re-parented, not in pid
	// files): recognised by the bed's containerd address on their command line.
	for _, pid := range shimsOf(filepath.Join(dir, "run", "containerd.sock")) {
		logf("teardown: killing containerd shim %d", pid)
		killAndWait(pid)
	}
	removeStaleShimFiles()
	// 3. Whatever still runs in the bed's cgroups (pause, probe containers).
	killCgroupProcs(cgroupParent)
	// 4. Mounts under the bed (rootfs, netns, kubelet volumes), deepest first.
	if err := UnmountUnder(dir); err != nil {
		errs = append(errs, err)
	}
	// 5. The bed's cgroup subtree in every hierarchy.
	if err := removeCgroups(cgroupParent); err != nil {
		errs = append(errs, err)
	}
	// 6. Host state: kubelet's log links, iptables chains, sysctls, links,
	// CNI cache.
	removeContainerLogLinks(dir)
	if b, err := os.ReadFile(filepath.Join(dir, "host-state.json")); err == nil {
		var st hostState
		if err := json.Unmarshal(b, &st); err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, restoreHost(st, logf)...)
		}
	}
	if _, err := os.Stat("/sys/class/net/" + bedBridge); err == nil {
		_ = exec.Command("ip", "link", "del", bedBridge).Run()
	}
	removeCNICache(dir)
	// 7. The directory itself.
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func stopOrder(pidFile string) int {
	order := []string{"kubelet", "kube-apiserver", "etcd", "containerd", "coordino-daemon"}
	base := strings.TrimSuffix(filepath.Base(pidFile), ".pid")
	for i, n := range order {
		if strings.HasPrefix(base, n) {
			return i
		}
	}
	return len(order)
}

// KillShims stops the runc shims a containerd listening on sock started
// (they are re-parented to init, so no pid file names them).
func KillShims(sock string) {
	for _, pid := range shimsOf(sock) {
		killAndWait(pid)
	}
}

// KillRecorded stops the process a Proc's pid file names, if it is still
// that process (PID and start time match), and removes the file.
func KillRecorded(pidFile string) error { return killRecorded(pidFile) }

// RemoveCgroupTree kills every process left in the cgroup subtree parent (in
// every hierarchy) and removes the subtree, children first.
func RemoveCgroupTree(parent string) error {
	killCgroupProcs(parent)
	return removeCgroups(parent)
}

func shimsOf(addr string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) == 0 || !strings.HasSuffix(args[0], "containerd-shim-runc-v2") {
			continue
		}
		for _, a := range args {
			if a == addr {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// cgroupDirs returns the cgroup subtree root parent in every mounted v1
// hierarchy (and the unified one, if any).
func cgroupDirs(parent string) []string {
	var dirs []string
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		d := filepath.Join("/sys/fs/cgroup", e.Name(), parent)
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

func killCgroupProcs(parent string) {
	for attempt := 0; attempt < 50; attempt++ {
		found := false
		for _, root := range cgroupDirs(parent) {
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						found = true
						_ = syscall.Kill(pid, syscall.SIGKILL)
					}
				}
				return nil
			})
		}
		if !found {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func removeCgroups(parent string) error {
	var errs []error
	for _, root := range cgroupDirs(parent) {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		// Children before parents: cgroup dirs are removed with rmdir only.
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for i := 0; i < 20; i++ {
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// UnmountUnder detaches every mount point at or below dir, deepest first.
func UnmountUnder(dir string) error {
	dir = filepath.Clean(dir)
	var errs []error
	for pass := 0; pass < 5; pass++ {
		mps, err := mountPoints(dir)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		errs = nil
		for _, mp := range mps {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("umount %s: %w", mp, err))
			}
		}
	}
	return errors.Join(errs...)
}

func mountPoints(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mps = append(mps, mp)
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	return mps, sc.Err()
}

// unescapeMount decodes mountinfo's octal escapes (\040 for space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func restoreHost(st hostState, logf func(string, ...any)) []error {
	var errs []error
	for bin := range map[string]bool{"iptables": true, "ip6tables": true} {
		for _, t := range iptablesTables {
			before := map[string]bool{}
			for _, c := range st.Chains[bin+"/"+t] {
				before[c] = true
			}
			for _, c := range kubeChains(bin, t) {
				if before[c] {
					continue
				}
				logf("teardown: removing %s -t %s chain %s", bin, t, c)
				if err := deleteChain(bin, t, c); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if !st.RunContainerd {
		// rmdir only: what is still in use by another containerd stays.
		for _, d := range []string{"runc/k8s.io", "runc", "s", ""} {
			_ = syscall.Rmdir(filepath.Join(shimSocketRoot, d))
		}
	}
	if !st.VarLogContainers {
		_ = syscall.Rmdir(containerLogLinks)
	}
	for s, v := range st.Sysctls {
		cur, err := os.ReadFile("/proc/sys/" + s)
		if err == nil && strings.TrimSpace(string(cur)) != v {
			logf("teardown: restoring %s=%s", s, v)
			if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

// deleteChain removes every rule jumping to chain, then flushes and deletes it.
func deleteChain(bin, table, chain string) error {
	out, err := exec.Command(bin, "-w", "-t", table, "-S").Output()
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "-A" || !strings.Contains(" "+l+" ", " -j "+chain+" ") {
			continue
		}
		args := append([]string{"-w", "-t", table, "-D"}, f[1:]...)
		_ = exec.Command(bin, args...).Run()
	}
	_ = exec.Command(bin, "-w", "-t", table, "-F", chain).Run()
	if out, err := exec.Command(bin, "-w", "-t", table, "-X", chain).CombinedOutput(); err != nil {
		return fmt.Errorf("%s -t %s -X %s: %v: %s", bin, table, chain, err, out)
	}
	return nil
}

// removeCNICache deletes libcni's cached results (/var/lib/cni/results, which
// containerd does not let us move) of the bed's networks, and those of any
// network for sandboxes whose containerd task state is still in the bed: a
// killed run leaves containerd's own "cni-loopback" entries for them.
func removeCNICache(dir string) {
	const results = "/var/lib/cni/results"
	for _, n := range bedNetworks {
		m, _ := filepath.Glob(filepath.Join(results, n+"-*"))
		for _, f := range m {
			_ = os.Remove(f)
		}
	}
	tasks, _ := os.ReadDir(filepath.Join(dir, "containerd", "state", "io.containerd.runtime.v2.task", "k8s.io"))
	if len(tasks) == 0 {
		return
	}
	ents, _ := os.ReadDir(results)
	for _, e := range ents {
		for _, t := range tasks {
			if strings.Contains(e.Name(), "-"+t.Name()+"-") {
				_ = os.Remove(filepath.Join(results, e.Name()))
				break
			}
		}
	}
}

// removeStaleShimFiles removes shim sockets under /run/containerd/s that
// nobody listens on any more (a shim killed during teardown cannot remove its
// own): a live socket, the bed's or anyone else's, is left alone.
func removeStaleShimFiles() {
	socks, _ := filepath.Glob(filepath.Join(shimSocketRoot, "s", "*"))
	for _, s := range socks {
		c, err := net.DialTimeout("unix", s, 200*time.Millisecond)
		if err == nil {
			c.Close()
			continue
		}
		if errors.Is(err, syscall.ECONNREFUSED) {
			_ = os.Remove(s)
		}
	}
}

// removeContainerLogLinks deletes kubelet's /var/log/containers symlinks (a
// fixed path in kubelet) that point into the bed.
func removeContainerLogLinks(dir string) {
	ents, _ := os.ReadDir(containerLogLinks)
	for _, e := range ents {
		p := filepath.Join(containerLogLinks, e.Name())
		if t, err := os.Readlink(p); err == nil && strings.HasPrefix(t, dir+"/") {
			_ = os.Remove(p)
		}
	}
}
