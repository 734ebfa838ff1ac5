package testbed

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Component versions; build.sh builds the same ones into the cache.
const (
	K8sVersion        = "v1.37.2"
	EtcdVersion       = "v3.7.3"
	ContainerdVersion = "v2.4.2"
	CrictlVersion     = "v1.37.0"
)

// Image references of the offline-built images.
const (
	PauseImage = "coordino.test/pause:1"
	ProbeImage = "coordino.test/probe:1"
)

// cgroupParent is the one cgroup subtree (in every v1 hierarchy) that holds
// all pods of the bed, kubelet's and crictl's alike, so teardown can empty
// and remove exactly what the bed created.
const cgroupParent = "coordino-testbed"

// Binaries are the upstream programs a bed runs.
type Binaries struct {
	Containerd, Shim, Ctr, Crictl string
	Etcd, APIServer, Kubelet      string
	Runc                          string
}

// Options configure a bed. Zero values take the defaults described below.
type Options struct {
	// Dir is the bed's root: sockets, state, logs, pid files. Default
	// $COORDINO_TESTBED_DIR or /run/coordino-testbed. Kept short because
	// unix socket paths are limited to 107 bytes.
	Dir string
	// Cache is where build.sh put the binaries. Default
	// $COORDINO_TESTBED_CACHE or /var/cache/coordino-testbed.
	Cache string
	// RepoRoot is the Coordino checkout (for test/testbed/images). Default:
	// found by walking up from the working directory to go.mod.
	RepoRoot string
	// Logf receives progress lines (t.Logf in tests).
	Logf func(format string, args ...any)
}

// Bed is one running test bed. Create it with New, start components with the
// Start* methods, and always call Teardown.
type Bed struct {
	Options
	Bins Binaries

	CNIBinDir string
	// ConfDirs maps containerd runtime handlers to their CNI conf dirs.
	ConfDirs map[string]string

	Containerd, Etcd, APIServer, Kubelet *Proc
	ContainerdSock                       string

	procs []*Proc
	// daemons are the Coordino daemons started on the bed (their pins say
	// whose a leftover netns is).
	daemons []*Daemon
}

func (o *Options) defaults() error {
	if o.Dir == "" {
		o.Dir = envOr("COORDINO_TESTBED_DIR", "/run/coordino-testbed")
	}
	if o.Cache == "" {
		o.Cache = envOr("COORDINO_TESTBED_CACHE", "/var/cache/coordino-testbed")
	}
	if o.RepoRoot == "" {
		root, err := repoRoot()
		if err != nil {
			return err
		}
		o.RepoRoot = root
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return nil
}

// EnvOr returns the environment variable k, or def when it is unset or empty.
func EnvOr(k, def string) string { return envOr(k, def) }

// RepoRoot finds the Coordino checkout (go.mod) at or above the working
// directory.
func RepoRoot() (string, error) { return repoRoot() }

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func repoRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/coordino/coordino\n") {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", errors.New("coordino repository root (go.mod) not found above the working directory")
		}
		d = parent
	}
}

// FindBinaries locates the cached upstream binaries. The error names the
// build command when something is missing. kube=false skips etcd, apiserver
// and kubelet (crictl-only runs).
func FindBinaries(cache string, kube bool) (Binaries, error) {
	c := func(comp, ver, bin string) string { return filepath.Join(cache, comp+"-"+ver, bin) }
	b := Binaries{
		Containerd: c("containerd", ContainerdVersion, "containerd"),
		Shim:       c("containerd", ContainerdVersion, "containerd-shim-runc-v2"),
		Ctr:        c("containerd", ContainerdVersion, "ctr"),
		Crictl:     c("crictl", CrictlVersion, "crictl"),
	}
	if kube {
		b.Etcd, b.APIServer, _ = ControlPlaneBinaries(cache)
		b.Kubelet = c("kubelet", K8sVersion, "kubelet")
	}
	var missing []string
	for _, p := range []string{b.Containerd, b.Shim, b.Ctr, b.Crictl, b.Etcd, b.APIServer, b.Kubelet} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("test bed binaries missing (%s); build them with test/testbed/build.sh", strings.Join(missing, ", "))
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		return b, errors.New("runc not found; install it with test/testbed/deps.sh")
	}
	b.Runc = runc
	return b, nil
}

// New tears down whatever a previous bed left in opts.Dir (idempotent), then
// creates a fresh directory layout and records the host state it may change.
func New(opts Options, kube bool) (*Bed, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	bins, err := FindBinaries(opts.Cache, kube)
	if err != nil {
		return nil, err
	}
	if err := Teardown(opts.Dir, opts.Logf); err != nil {
		return nil, fmt.Errorf("pre-run cleanup of %s: %w", opts.Dir, err)
	}
	b := &Bed{Options: opts, Bins: bins, ConfDirs: map[string]string{}}
	for _, d := range []string{"pids", "logs", "run", "cni/bin"} {
		if err := os.MkdirAll(b.path(d), 0o755); err != nil {
			return nil, err
		}
	}
	b.CNIBinDir = b.path("cni/bin")
	if err := recordHostState(b.Dir); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *Bed) path(elem ...string) string {
	return filepath.Join(append([]string{b.Dir}, elem...)...)
}

// LogPath returns where a component's output goes.
func (b *Bed) LogPath(name string) string { return b.path("logs", name+".log") }

// Start launches and records a process of the bed.
func (b *Bed) Start(p *Proc) error {
	if p.LogPath == "" {
		p.LogPath = b.LogPath(p.Name)
	}
	if err := p.Start(b.path("pids")); err != nil {
		return err
	}
	b.procs = append(b.procs, p)
	return nil
}

// Teardown stops everything of the bed and removes its directory. It is also
// what New runs first, so it must cope with any half-finished state.
func (b *Bed) Teardown() error {
	// Pods first, while containerd still runs, so runc and the CNI plugins
	// clean up through the normal path (and Coordino sees its DELs).
	if b.Kubelet != nil {
		_ = b.Kubelet.Stop(10 * time.Second)
	}
	if b.Containerd != nil && b.Containerd.Running() {
		b.RemoveAllPods()
	}
	for i := len(b.procs) - 1; i >= 0; i-- {
		_ = b.procs[i].Stop(10 * time.Second)
	}
	return Teardown(b.Dir, b.Logf)
}

// RemoveAllPods stops and removes every sandbox through CRI.
func (b *Bed) RemoveAllPods() {
	out, err := b.Crictl("pods", "-q")
	if err != nil {
		return
	}
	for _, id := range strings.Fields(out) {
		_, _ = b.Crictl("stopp", id)
		_, _ = b.Crictl("rmp", "-f", id)
	}
}
