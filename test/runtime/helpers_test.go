package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coordino/coordino/test/privileged"
	"github.com/coordino/coordino/test/testbed"
)

// gate skips unless the runtime e2e was asked for; kube says whether the test
// needs the kubelet half of the bed.
func gate(t *testing.T, kube bool) {
	t.Helper()
	v := os.Getenv("COORDINO_RUNTIME_E2E")
	switch {
	case v == "":
		t.Skip("runtime e2e: set COORDINO_RUNTIME_E2E=1 (or =cri for the crictl part only)")
	case v == "cri" && kube:
		t.Skip("runtime e2e: COORDINO_RUNTIME_E2E=cri runs the crictl part only")
	}
	privileged.Require(t)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

// coordinoBins returns bin/coordino and bin/coordino-daemon, failing the test
// when `make build` has not produced them.
func coordinoBins(t *testing.T) (plugin, daemon string) {
	t.Helper()
	bin := filepath.Join(repoRoot(t), "bin")
	plugin, daemon = filepath.Join(bin, "coordino"), filepath.Join(bin, "coordino-daemon")
	for _, p := range []string{plugin, daemon} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s missing: run `make build` first", p)
		}
	}
	return plugin, daemon
}

// newBed creates a bed, registers its teardown (which also runs when the test
// fails half way) and starts containerd with the images imported and the
// reference plugins installed.
func newBed(t *testing.T, ctx context.Context, kube bool) *testbed.Bed {
	t.Helper()
	start := time.Now()
	b, err := testbed.New(testbed.Options{RepoRoot: repoRoot(t), Logf: t.Logf}, kube)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			dumpLogs(t, b)
		}
		keepLogs(t, b)
		if err := b.Teardown(); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	root := repoRoot(t)
	// bin/ref (make ref-plugins) first; Debian's package as a fallback.
	src := []string{filepath.Join(root, "bin", "ref"), "/usr/lib/cni"}
	if err := b.InstallPlugins(src, "bridge", "host-local"); err != nil {
		t.Fatal(err)
	}
	if err := b.StartContainerd(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.BuildImages(); err != nil {
		t.Fatal(err)
	}
	t.Logf("bed up (containerd, images) in %s", time.Since(start).Round(time.Millisecond))
	return b
}

// dumpLogs prints the tail of every component log of a failed test.
func dumpLogs(t *testing.T, b *testbed.Bed) {
	logs, _ := filepath.Glob(filepath.Join(b.Dir, "logs", "*.log"))
	for _, l := range logs {
		data, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		t.Logf("---- tail of %s\n%s", l, strings.Join(lines, "\n"))
	}
}

// keepLogs copies the bed's logs to $COORDINO_RUNTIME_E2E_LOGS/<test> when
// set: teardown removes the bed directory, logs included.
func keepLogs(t *testing.T, b *testbed.Bed) {
	dst := os.Getenv("COORDINO_RUNTIME_E2E_LOGS")
	if dst == "" {
		return
	}
	dir := filepath.Join(dst, strings.ReplaceAll(t.Name(), "/", "_"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Log(err)
		return
	}
	logs, _ := filepath.Glob(filepath.Join(b.Dir, "logs", "*.log"))
	for _, l := range logs {
		if data, err := os.ReadFile(l); err == nil {
			_ = os.WriteFile(filepath.Join(dir, filepath.Base(l)), data, 0o644)
		}
	}
}

// startDaemon installs the Coordino plugin into the bed and starts a daemon
// with the test's own run/state dirs.
func startDaemon(t *testing.T, ctx context.Context, b *testbed.Bed, cidrs ...string) *testbed.Daemon {
	t.Helper()
	plugin, daemonBin := coordinoBins(t)
	if err := testbed.CheckCIDRsFree(cidrs...); err != nil {
		t.Fatal(err)
	}
	if err := b.InstallPlugins([]string{filepath.Dir(plugin)}, "coordino"); err != nil {
		t.Fatal(err)
	}
	// Inside the bed's directory (short: the daemon's unix socket lives
	// there), so the bed's teardown also unmounts its netns pins and bpffs
	// when a killed test run never reached its cleanup.
	base, err := os.MkdirTemp(b.Dir, "coordino-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := testbed.UnmountUnder(base); err != nil {
			t.Errorf("unmount %s: %v", base, err)
		}
		if err := os.RemoveAll(base); err != nil {
			t.Errorf("remove %s: %v", base, err)
		}
	})
	// Pinned maps and links need bpffs: the test mounts its own instance
	// (unmounted with the rest of base) rather than sharing /sys/fs/bpf.
	bpfDir := filepath.Join(base, "bpf")
	if err := os.MkdirAll(bpfDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("bpf", bpfDir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs on %s: %v", bpfDir, err)
	}
	d, err := b.StartDaemon(ctx, daemonBin, base, bpfDir, testbed.NodeName, cidrs...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Pods go first, while the daemon can still serve their DELs.
		if b.Kubelet != nil {
			_ = b.Kubelet.Stop(10 * time.Second)
		}
		b.RemoveAllPods()
		_ = d.Stop(10 * time.Second)
	})
	return d
}

// sandboxConfig writes a crictl PodSandboxConfig and returns its path.
func sandboxConfig(t *testing.T, dir, name string) string {
	t.Helper()
	cfg := map[string]any{
		"metadata": map[string]any{"name": name, "namespace": "coordino-e2e", "uid": name + "-uid", "attempt": 0},
		"hostname": name,
		// Pods of the bed live under one cgroup subtree (removed by teardown).
		"log_directory": filepath.Join(dir, "logs", name),
		"linux": map[string]any{
			"cgroup_parent":    "/coordino-testbed/crictl",
			"security_context": map[string]any{"namespace_options": map[string]any{"network": 0}},
		},
	}
	return writeJSON(t, filepath.Join(dir, name+".pod.json"), cfg)
}

func probeContainerConfig(t *testing.T, dir string) string {
	t.Helper()
	cfg := map[string]any{
		"metadata": map[string]any{"name": "probe"},
		"image":    map[string]any{"image": testbed.ProbeImage},
		"command":  []string{"/probe", "serve", "-port", "8080"},
		"log_path": "probe.log",
		"linux":    map[string]any{},
	}
	return writeJSON(t, filepath.Join(dir, "probe.ctr.json"), cfg)
}

func writeJSON(t *testing.T, path string, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runp creates a sandbox on a runtime handler and returns its id, its IP and
// how long RunPodSandbox took as seen by crictl.
func runp(t *testing.T, b *testbed.Bed, handler, podJSON string) (id string, ip netip.Addr, took time.Duration) {
	t.Helper()
	start := time.Now()
	id, err := b.Crictl("runp", "--runtime", handler, podJSON)
	took = time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	out, err := b.Crictl("inspectp", "-o", "go-template", "--template", "{{.status.network.ip}}", id)
	if err != nil {
		t.Fatal(err)
	}
	ip, err = netip.ParseAddr(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("sandbox %s has no IP: %q", id, out)
	}
	return id, ip, took
}

func stopRemove(t *testing.T, b *testbed.Bed, id string) {
	t.Helper()
	if _, err := b.Crictl("stopp", id); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Crictl("rmp", id); err != nil {
		t.Fatal(err)
	}
}

// durations collects latency samples and prints percentiles.
type durations []time.Duration

func (d durations) pct(p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append(durations(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p/100*float64(len(s))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

func (d durations) String() string {
	return fmt.Sprintf("p50=%s p90=%s (n=%d)", d.pct(50).Round(100*time.Microsecond), d.pct(90).Round(100*time.Microsecond), len(d))
}
