package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/coordino/coordino/test/testbed"
)

// Versions of the components the cluster runs besides test/testbed's.
const CoreDNSVersion = "v1.15.0"

// Options configure a cluster. Zero values take the defaults below.
type Options struct {
	// Dir is the cluster's root (state, logs, pid files, per-node
	// directories). Default $COORDINO_CLUSTER_DIR or /run/coordino-cluster;
	// short because unix socket paths are limited to 107 bytes.
	Dir string
	// Workers is the number of worker nodes (default 2).
	Workers int
	// Cache is where test/testbed/build.sh put the binaries.
	Cache string
	// RepoRoot is the Coordino checkout (manifests, bin/coordino-image.tar).
	RepoRoot string
	// ImageArchive is Coordino's image (make image). Default
	// $COORDINO_CLUSTER_IMAGE or RepoRoot/bin/coordino-image.tar.
	ImageArchive string
	// ExtraImages are more image archives every node imports, such as a
	// second Coordino image to roll to (make e2e-upgrade).
	ExtraImages []string
	// Overlay is the kustomize directory installed (default
	// $COORDINO_CLUSTER_OVERLAY or install/kubernetes/overlays/primary).
	Overlay string
	// Datapath, when set, starts every daemon with --datapath=<it> (ebpf,
	// nftables or auto); Install then checks each daemon reports it.
	// Default $COORDINO_CLUSTER_DATAPATH; empty keeps the manifest's.
	Datapath string
	// Routing "bgp" stands the workers in two racks on different subnets
	// behind an FRR router in a namespace of its own, starts every daemon
	// with --routing=bgp and applies a BGPPeerPolicy per rack (see
	// racks_linux.go). Default $COORDINO_CLUSTER_ROUTING; empty: one
	// segment and the manifest's routing.
	Routing string
	// SkipInstall brings nodes up without Coordino (they stay NotReady
	// unless PrimaryCNI gives them a CNI).
	SkipInstall bool
	// PrimaryCNI, when "bridge", writes a reference bridge + host-local
	// conflist on every worker before Coordino is installed: the primary
	// the chained overlay attaches to, or (with SkipInstall) the reference
	// CNI of the density benchmark.
	PrimaryCNI string
	// RefPluginDir holds the reference plugins (make ref-plugins; default
	// RepoRoot/bin/ref).
	RefPluginDir string
	// MaxPods is each kubelet's maxPods (default 110, kubelet's own).
	MaxPods int
	// Logf receives progress lines.
	Logf func(format string, args ...any)
}

// Cluster is a running multi-node cluster. Create it with Up; always call
// Down.
type Cluster struct {
	Options
	// Kubeconfig is the admin kubeconfig (server on the control plane's
	// underlay address, reached from the host).
	Kubeconfig string
	Client     kubernetes.Interface
	// Nodes are the worker node names, worker-1 ... worker-N.
	Nodes []string

	bins    binaries
	pki     *testbed.PKI
	nsenter string
	state   state
	cp      *machine
	workers []*machine
	// outside is the outside host's namespace (OutsideIP).
	outside netns.NsHandle
	procs   []*testbed.Proc
}

// state is what Teardown needs to undo a cluster, written before each thing
// is created.
type state struct {
	Netns       []string `json:"netns"`
	HostLink    string   `json:"hostLink"`
	MountPoints []string `json:"mountPoints"`
	CgroupRoot  string   `json:"cgroupRoot"`
}

type binaries struct {
	etcd, apiServer, controllerManager, scheduler, kubelet, kubeProxy, kubectl string
	containerd, shim, ctr, runc, coredns, agnhost                              string
}

func findBinaries(cache string) (binaries, error) {
	c := func(comp, ver, bin string) string { return filepath.Join(cache, comp+"-"+ver, bin) }
	k := func(comp string) string { return c(comp, testbed.K8sVersion, comp) }
	b := binaries{
		etcd: c("etcd", testbed.EtcdVersion, "etcd"), apiServer: k("kube-apiserver"),
		controllerManager: k("kube-controller-manager"), scheduler: k("kube-scheduler"),
		kubelet: k("kubelet"), kubeProxy: k("kube-proxy"), kubectl: k("kubectl"),
		containerd: c("containerd", testbed.ContainerdVersion, "containerd"),
		shim:       c("containerd", testbed.ContainerdVersion, "containerd-shim-runc-v2"),
		ctr:        c("containerd", testbed.ContainerdVersion, "ctr"),
		coredns:    c("coredns", CoreDNSVersion, "coredns"), agnhost: k("agnhost"),
	}
	var missing []string
	for _, p := range []string{b.etcd, b.apiServer, b.controllerManager, b.scheduler, b.kubelet, b.kubeProxy, b.kubectl, b.containerd, b.shim, b.ctr, b.coredns, b.agnhost} {
		if _, err := os.Stat(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("cluster binaries missing (%s); build them with test/testbed/build.sh cluster", strings.Join(missing, ", "))
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		return b, errors.New("runc not found; install it with test/testbed/deps.sh")
	}
	b.runc = runc
	return b, nil
}

func (o *Options) defaults() error {
	if o.Dir == "" {
		o.Dir = testbed.EnvOr("COORDINO_CLUSTER_DIR", DefaultDir)
	}
	if o.Workers == 0 {
		o.Workers = 2
	}
	if o.Cache == "" {
		o.Cache = testbed.EnvOr("COORDINO_TESTBED_CACHE", "/var/cache/coordino-testbed")
	}
	if o.RepoRoot == "" {
		root, err := testbed.RepoRoot()
		if err != nil {
			return err
		}
		o.RepoRoot = root
	}
	if o.ImageArchive == "" {
		o.ImageArchive = testbed.EnvOr("COORDINO_CLUSTER_IMAGE", filepath.Join(o.RepoRoot, "bin", "coordino-image.tar"))
	}
	if o.Overlay == "" {
		o.Overlay = testbed.EnvOr("COORDINO_CLUSTER_OVERLAY", filepath.Join(o.RepoRoot, "install", "kubernetes", "overlays", "primary"))
	}
	if o.Datapath == "" {
		o.Datapath = os.Getenv("COORDINO_CLUSTER_DATAPATH")
	}
	if err := checkDatapath(o.Datapath); err != nil {
		return err
	}
	if o.Routing == "" {
		o.Routing = os.Getenv("COORDINO_CLUSTER_ROUTING")
	}
	if err := checkRouting(o.Routing); err != nil {
		return err
	}
	if o.RefPluginDir == "" {
		o.RefPluginDir = filepath.Join(o.RepoRoot, "bin", "ref")
	}
	if o.MaxPods == 0 {
		o.MaxPods = 110
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return nil
}

func (c *Cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.Dir}, elem...)...)
}

func (c *Cluster) logPath(name string) string { return c.path("logs", name+".log") }

// LogPath returns where a component's output goes ("control-plane-kube-apiserver",
// "worker-1-kubelet", ...).
func (c *Cluster) LogPath(name string) string { return c.logPath(name) }

func (c *Cluster) saveState() error {
	b, err := json.MarshalIndent(c.state, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(c.path("state.json"), b, 0o644)
}

func (c *Cluster) createMountPoint(dst string) error {
	// Record the outermost missing directory: teardown removes it (when
	// empty) and everything created below it.
	top := dst
	for {
		parent := filepath.Dir(top)
		if _, err := os.Stat(parent); err == nil {
			break
		}
		top = parent
	}
	c.state.MountPoints = append(c.state.MountPoints, top)
	if err := c.saveState(); err != nil {
		return err
	}
	return os.MkdirAll(dst, 0o755)
}

// DefaultDir is the root of make cluster-up's bed (COORDINO_CLUSTER_DIR
// moves it).
const DefaultDir = "/run/coordino-cluster"

// Running reports whether a cluster rooted at dir is up: its state is
// there and a machine holder it recorded still runs.
func Running(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, "state.json")); err != nil {
		return false
	}
	holders, _ := filepath.Glob(filepath.Join(dir, "pids", "*-holder.pid"))
	for _, h := range holders {
		if testbed.RecordedAlive(h) {
			return true
		}
	}
	return false
}

// bedInTheWay explains Up's refusal to start when the address plan is
// taken: one cluster per machine, and the usual holder is make cluster-up's
// bed, which the suites can use as it is.
func bedInTheWay(cidrErr error, dirs ...string) error {
	for _, d := range dirs {
		if Running(d) {
			return fmt.Errorf("%w: the cluster bed in %s is up (make cluster-up); run the suites against it "+
				"(test/cluster/e2e.sh, make e2e-cluster uses it) or remove it first with make cluster-down", cidrErr, d)
		}
	}
	return cidrErr
}

// Up builds a cluster: it removes whatever a previous cluster left in
// opts.Dir, creates the namespaces and the underlay, starts the control
// plane and the workers, and installs Coordino, CoreDNS and the test images.
// On error the cluster is torn down.
func Up(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	bins, err := findBinaries(opts.Cache)
	if err != nil {
		return nil, err
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return nil, errors.New("nsenter not found (util-linux)")
	}
	cidrs := []string{UnderlayCIDR, PodCIDR}
	if opts.Routing == "bgp" {
		cidrs = append(cidrs, rackCIDR(1).String())
	}
	if err := testbed.CheckCIDRsFree(cidrs...); err != nil {
		return nil, bedInTheWay(err, opts.Dir, DefaultDir)
	}
	if err := Teardown(opts.Dir, opts.Logf); err != nil {
		return nil, fmt.Errorf("pre-run cleanup of %s: %w", opts.Dir, err)
	}
	c := &Cluster{Options: opts, bins: bins, nsenter: nsenter}
	for _, d := range []string{"pids", "logs", "images"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			if serr := c.saveLogs(); serr != nil {
				c.Logf("cluster: %v; tearing down, which removes the logs in %s (keeping them failed: %v)", err, c.path("logs"), serr)
			} else {
				c.Logf("cluster: %v; tearing down (logs kept in %s until make cluster-down)", err, SavedLogsDir(c.Dir))
			}
			_ = c.Down()
		}
	}()
	suffix := make([]byte, 3)
	_, _ = rand.Read(suffix)
	sfx := hex.EncodeToString(suffix)
	c.state.CgroupRoot = "coordino-cluster-" + sfx
	c.state.HostLink = "cbh-" + sfx
	if err := c.saveState(); err != nil {
		return nil, err
	}

	start := time.Now()
	if err := c.buildNetwork(sfx); err != nil {
		return nil, err
	}
	c.Logf("cluster: network up (%s)", time.Since(start).Round(time.Millisecond))
	if c.racks() > 1 {
		if err := c.startRouter(ctx, "cb-"+sfx+"-r"); err != nil {
			return nil, err
		}
		c.Logf("cluster: %d racks behind FRR (AS %d) in cb-%s-r (%s)", c.racks(), RouterASN, sfx, time.Since(start).Round(time.Millisecond))
	}
	if err := c.startControlPlane(ctx); err != nil {
		return nil, err
	}
	c.Logf("cluster: control plane ready (%s)", time.Since(start).Round(time.Millisecond))
	images, err := c.buildImages()
	if err != nil {
		return nil, err
	}
	images = append(images, c.ExtraImages...)
	for i, m := range c.workers {
		if err := c.startWorker(ctx, i+1, m, images); err != nil {
			return nil, err
		}
	}
	c.Logf("cluster: %d workers registered (%s)", len(c.workers), time.Since(start).Round(time.Millisecond))
	if c.PrimaryCNI != "" {
		if err := c.installPrimaryCNI(ctx); err != nil {
			return nil, err
		}
		c.Logf("cluster: %s primary CNI on every worker (%s)", c.PrimaryCNI, time.Since(start).Round(time.Millisecond))
	}
	if c.SkipInstall {
		return c, nil
	}
	if err := c.Install(ctx); err != nil {
		return nil, err
	}
	c.Logf("cluster: Coordino and CoreDNS installed, nodes Ready (%s)", time.Since(start).Round(time.Millisecond))
	return c, nil
}

// buildNetwork creates the underlay, the control plane and worker
// namespaces and the host's veth to the underlay.
func (c *Cluster) buildNetwork(sfx string) error {
	name := func(s string) string { return "cb-" + sfx + "-" + s }
	c.state.Netns = append(c.state.Netns, name("u"))
	if err := c.saveState(); err != nil {
		return err
	}
	u, err := newUnderlay(name("u"))
	if err != nil {
		return err
	}
	defer u.ns.Close()
	newMachine := func(short, machineName string) (*machine, error) {
		c.state.Netns = append(c.state.Netns, name(short))
		if err := c.saveState(); err != nil {
			return nil, err
		}
		h, err := newNamedNetns(name(short))
		if err != nil {
			return nil, err
		}
		return &machine{name: machineName, ns: h}, nil
	}
	if c.cp, err = newMachine("cp", "control-plane"); err != nil {
		return err
	}
	if err := u.attach("cp", c.cp.ns, "eth0", controlPlaneIP); err != nil {
		return err
	}
	if c.racks() > 1 {
		if err := c.buildRouter(u, name("r")); err != nil {
			return err
		}
		// The control plane reaches the other racks' nodes (kubelets,
		// webhooks on the host network) through the router.
		for r := 1; r < c.racks(); r++ {
			if err := addRoute(c.cp.ns, rackCIDR(r), routerIP(0)); err != nil {
				return err
			}
		}
	}
	for i := 1; i <= c.Workers; i++ {
		m, err := newMachine(fmt.Sprintf("w%d", i), fmt.Sprintf("worker-%d", i))
		if err != nil {
			return err
		}
		if err := u.attachTo(fmt.Sprintf("br%d", c.rackOf(i)), fmt.Sprintf("w%d", i), m.ns, "eth0", c.workerIP(i)); err != nil {
			return err
		}
		// A node forwards (kubeadm's preflight insists); the CNI and
		// kube-proxy rely on it.
		if err := setSysctl(m.ns, "net/ipv4/ip_forward", "1"); err != nil {
			return err
		}
		// A node has a default route: Service addresses (kube-proxy
		// rewrites them after the route lookup) need one. It leads to the
		// control plane, which forwards nothing, so what kube-proxy or the
		// CNI does not route goes nowhere.
		// With racks, the default route leads to the rack's router, which
		// forwards only to the racks and to what BGP taught it.
		gw := controlPlaneIP
		if c.racks() > 1 {
			gw = routerIP(c.rackOf(i))
		}
		if err := addDefaultRoute(m.ns, gw); err != nil {
			return err
		}
		// The control plane answers pods (API server, webhooks) through
		// the node that owns each pod range (or the router to its rack).
		if err := addRoute(c.cp.ns, workerPodCIDR(i), c.nodeGateway(i)); err != nil {
			return err
		}
		c.workers = append(c.workers, m)
		c.Nodes = append(c.Nodes, m.name)
	}
	out, err := newMachine("out", "outside")
	if err != nil {
		return err
	}
	c.outside = out.ns
	if err := u.attach("out", c.outside, "eth0", OutsideIP); err != nil {
		return err
	}
	host, err := netns.Get()
	if err != nil {
		return err
	}
	defer host.Close()
	if err := u.attach("host", host, c.state.HostLink, hostUnderlayIP); err != nil {
		return err
	}
	// The host reaches the other racks' nodes (metrics, kubelets) through
	// the router; the route goes with the host's link.
	for r := 1; r < c.racks(); r++ {
		if err := addRoute(host, rackCIDR(r), routerIP(0)); err != nil {
			return err
		}
	}
	return nil
}

// InOutside runs fn on a thread in the outside host's namespace (a
// listener opened there stays in it).
func (c *Cluster) InOutside(fn func() error) error {
	return inNetns(c.outside, fn)
}

// Down stops everything the cluster started and removes what it created.
func (c *Cluster) Down() error {
	for _, m := range append([]*machine{c.cp}, c.workers...) {
		if m != nil {
			m.ns.Close()
		}
	}
	if c.outside != 0 {
		c.outside.Close()
	}
	return Teardown(c.Dir, c.Logf)
}

// SavedLogsDir is where a failed Up keeps the component logs of the
// cluster rooted at dir: beside dir, which its tear-down removes. The next
// failed Up replaces them; `cluster down` removes them.
func SavedLogsDir(dir string) string { return dir + "-logs" }

// saveLogs moves the component logs of a failed start to SavedLogsDir.
func (c *Cluster) saveLogs() error {
	dst := SavedLogsDir(c.Dir)
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	return os.Rename(c.path("logs"), dst)
}

// Kubectl runs the cached kubectl against the cluster and returns its
// combined output.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.bins.kubectl, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// KubectlPath is the cached kubectl binary.
func (c *Cluster) KubectlPath() string { return c.bins.kubectl }

func (c *Cluster) newClient() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 100, 200
	c.Client, err = kubernetes.NewForConfig(cfg)
	return err
}

// ips is a helper for certificate SANs.
func ips(addrs ...netip.Addr) []net.IP {
	var out []net.IP
	for _, a := range addrs {
		out = append(out, a.AsSlice())
	}
	return out
}
