//go:build linux

package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/privileged"
)

// hostBPFFSEnv makes a re-executed test binary stand in for a host that
// mounts bpffs itself (systemd, or a Coordino daemon that found none): in a
// mount namespace of its own it mounts one on /sys/fs/bpf with the
// propagation named by the variable, starts a machine holder, and prints
// the holder's mounts on /sys/fs/bpf as JSON. The real host's mounts are
// never touched.
const hostBPFFSEnv = "COORDINO_CLUSTER_TEST_HOST_BPFFS"

func init() {
	if prop := os.Getenv(hostBPFFSEnv); prop != "" {
		if err := hostWithBPFFS(prop); err != nil {
			fmt.Fprintln(os.Stderr, "host with bpffs:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// bpffsMount is one /proc/PID/mountinfo line on /sys/fs/bpf.
type bpffsMount struct {
	FSType   string   `json:"fstype"`
	Optional []string `json:"optional"` // shared:N, master:N, ...
}

func hostWithBPFFS(prop string) error {
	flags := map[string]uintptr{"private": unix.MS_PRIVATE, "shared": unix.MS_SHARED}[prop]
	if flags == 0 {
		return fmt.Errorf("propagation %q: want private or shared", prop)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / rslave: %w", err)
	}
	if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount the host's bpffs: %w", err)
	}
	if err := unix.Mount("", "/sys/fs/bpf", "", flags, ""); err != nil {
		return fmt.Errorf("make the host's bpffs %s: %w", prop, err)
	}
	spec, err := json.Marshal(machineSpec{Hostname: "cb-test-holder", BPFFS: true})
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	holder := exec.Command(self)
	holder.Env = append(slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, hostBPFFSEnv+"=") }),
		holderEnv+"="+string(spec))
	holder.Stderr = os.Stderr
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS}
	out, err := holder.StdoutPipe()
	if err != nil {
		return err
	}
	if err := holder.Start(); err != nil {
		return fmt.Errorf("start the holder: %w", err)
	}
	defer func() {
		_ = holder.Process.Signal(syscall.SIGTERM)
		_ = holder.Wait()
	}()
	if line, _ := bufio.NewReader(out).ReadString('\n'); strings.TrimSpace(line) != "ready" {
		return fmt.Errorf("holder not ready: %q", line)
	}
	mounts, err := mountsOn(holder.Process.Pid, "/sys/fs/bpf")
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(mounts)
}

// mountsOn lists the mounts of pid's mount namespace on path, in
// mountinfo's order (the order containerd's lookup sees them).
func mountsOn(pid int, path string) ([]bpffsMount, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/mountinfo")
	if err != nil {
		return nil, err
	}
	var mounts []bpffsMount
	for _, l := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 1 || f[4] != path {
			continue
		}
		mounts = append(mounts, bpffsMount{FSType: g[0], Optional: f[6:]})
	}
	return mounts, nil
}

// TestHolderReplacesHostBPFFS: on a host that already mounts bpffs, a
// machine's /sys/fs/bpf must be exactly one mount, the machine's own shared
// bpffs. With the host's copy left underneath, containerd finds that copy
// first and refuses the DaemonSet's Bidirectional mount of /sys/fs/bpf
// ("is mounted on /sys/fs/bpf but it is not a shared mount").
func TestHolderReplacesHostBPFFS(t *testing.T) {
	privileged.Require(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, prop := range []string{"private", "shared"} {
		t.Run("host bpffs "+prop, func(t *testing.T) {
			cmd := exec.Command(self)
			cmd.Env = append(os.Environ(), hostBPFFSEnv+"="+prop)
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("host with a %s bpffs: %v: %s", prop, err, stderr.String())
			}
			var mounts []bpffsMount
			if err := json.Unmarshal(out, &mounts); err != nil {
				t.Fatalf("holder's mounts %q: %v", out, err)
			}
			if len(mounts) != 1 {
				t.Fatalf("holder has %d mounts on /sys/fs/bpf, want only its own: %+v", len(mounts), mounts)
			}
			m := mounts[0]
			shared := slices.ContainsFunc(m.Optional, func(o string) bool { return strings.HasPrefix(o, "shared:") })
			if m.FSType != "bpf" || !shared {
				t.Errorf("holder's /sys/fs/bpf is %+v, want a shared bpf mount", m)
			}
		})
	}
}
