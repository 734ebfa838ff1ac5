package wireguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/coordino/coordino/daemon/peers"
	"github.com/coordino/coordino/daemon/routing"
)

// Defaults of the device.
const (
	DefaultDevice     = "coordino-wg"
	DefaultListenPort = 51871
	// FirewallMark is set on the device's own UDP packets; everything else
	// consults NodeTable first, so node-to-node traffic is encrypted
	// without looping the tunnel into itself.
	FirewallMark = 0xc5c5
	NodeTable    = 0xc5c5
	rulePriority = 99
)

// superviseInterval is how often the device is checked to answer on its
// control socket; a dead userspace process is restarted and reconfigured.
// An external device is restarted by its own pod, and every moment it runs
// unconfigured its peers' pods are unreachable: it is checked more often.
const (
	superviseInterval         = 2 * time.Second
	superviseIntervalExternal = 200 * time.Millisecond
)

// externalWait bounds how long a start waits for an external device, whose
// pod may start after the daemon's.
var externalWait = 60 * time.Second

// Config configures the node's device.
type Config struct {
	Self       string
	Device     string
	ListenPort int
	// MTU of the device: the underlay MTU minus routing.WireGuardOverhead.
	MTU      int
	StateDir string
	RunDir   string
	// UserspaceBinary is coordino-wireguard, used when the kernel has no module.
	UserspaceBinary string
	// Kind chooses the device: KindAuto ("" too), KindKernel or
	// KindUserspace.
	Kind string
	// KernelWireGuard says the kernel has WireGuard (daemon/kernel's
	// table): without it KindKernel fails before touching a running
	// device, which keeps forwarding while the option is corrected.
	KernelWireGuard bool
	// LogHandshakes makes the userspace device log every handshake to
	// wireguard-<device>.log in RunDir (the daemon sets it at log level debug).
	LogHandshakes bool
	// NodeToNode also routes (and accepts) peer node addresses through the
	// tunnel, so node-to-node and node-to-remote-pod traffic is encrypted.
	NodeToNode bool
	// KeyMaxAge starts a key rotation once the private key file is older
	// (0: only on request, see RotateTriggerFile).
	KeyMaxAge time.Duration
	// OnPublicKey, when set, is called with the key peers must be told
	// about whenever it changes (a rotation was prepared): the hook for
	// publishing it in NodeConfig. Standalone, wireguard.pub is the record.
	OnPublicKey func(wgtypes.Key)
}

// Device kinds (Config.Kind).
const (
	// KindAuto takes the kernel's device where the kernel has WireGuard,
	// else the userspace process.
	KindAuto = "auto"
	// KindKernel requires the kernel's device.
	KindKernel = "kernel"
	// KindUserspace always runs the userspace process.
	KindUserspace = "userspace"
	// KindExternal adopts a userspace device another process runs (the
	// coordino-wireguard DaemonSet): a device in the daemon's own container
	// ends with the daemon's pod, and pod traffic to other nodes with it,
	// for as long as the replacement takes. The daemon configures this
	// device but never starts or ends it.
	KindExternal = "external"
)

// Device is this node's WireGuard device and its configuration.
type Device struct {
	cfg       Config
	log       *zap.Logger
	client    *wgctrl.Client
	key       wgtypes.Key
	userspace bool
	router    *routing.Router

	mu   sync.Mutex
	last peers.Set
	// next is the pending key of a rotation (nil: none).
	next *wgtypes.Key
}

// Start loads (or creates) the key and brings the device up: an existing
// one is adopted, so a daemon restart never interrupts the tunnel.
func Start(cfg Config, log *zap.Logger) (*Device, error) {
	if cfg.Device == "" {
		cfg.Device = DefaultDevice
	}
	if cfg.ListenPort == 0 {
		cfg.ListenPort = DefaultListenPort
	}
	if cfg.Kind == KindKernel && !cfg.KernelWireGuard {
		return nil, kernelKindError(cfg.Device, errors.New("the kernel has no WireGuard"))
	}
	key, err := LoadOrCreateKey(cfg.StateDir)
	if err != nil {
		return nil, fmt.Errorf("wireguard key: %w", err)
	}
	client, err := wgctrl.New()
	if err != nil {
		return nil, fmt.Errorf("wgctrl: %w", err)
	}
	d := &Device{cfg: cfg, log: log, client: client, key: key}
	if next, ok, err := LoadNextKey(cfg.StateDir); err != nil {
		client.Close()
		return nil, fmt.Errorf("wireguard key: %w", err)
	} else if ok {
		d.next = &next
	}
	if err := d.ensureWaiting(); err != nil {
		client.Close()
		return nil, err
	}
	d.router, err = routing.New(routing.Config{Self: cfg.Self, Device: cfg.Device}, log)
	if err != nil {
		client.Close()
		return nil, err
	}
	// Only the public half is ever logged.
	log.Info("wireguard device ready", zap.String("device", cfg.Device), zap.Bool("userspace", d.userspace),
		zap.String("publicKey", key.PublicKey().String()), zap.Int("listenPort", cfg.ListenPort),
		zap.String("publicKeyFile", filepath.Join(cfg.StateDir, PublicKeyFile)))
	return d, nil
}

// PublicKey is what peers need to know about this node.
func (d *Device) PublicKey() wgtypes.Key { return d.key.PublicKey() }

// Userspace reports whether the device is the userspace process.
func (d *Device) Userspace() bool { return d.userspace }

// ensureWaiting is ensure, waiting up to externalWait for an external
// device to answer.
func (d *Device) ensureWaiting() error {
	err := d.ensure()
	if err == nil || d.cfg.Kind != KindExternal {
		return err
	}
	d.log.Info("waiting for the external wireguard device", zap.String("device", d.cfg.Device), zap.Duration("upTo", externalWait))
	for deadline := time.Now().Add(externalWait); err != nil && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		err = d.ensure()
	}
	return err
}

// ensure adopts a working device or creates one, then sets key, port, mark
// and MTU where they differ.
func (d *Device) ensure() error {
	name := d.cfg.Device
	if _, err := d.client.Device(name); err != nil {
		if d.cfg.Kind == KindExternal {
			// A link without a control plane may be that process starting:
			// it is not ours to remove.
			return fmt.Errorf("wireguard device %s does not answer on /var/run/wireguard/%s.sock (--wireguard-device-kind=external: the coordino-wireguard DaemonSet runs it): %w", name, name, err)
		}
		if l, lerr := netlink.LinkByName(name); lerr == nil {
			// A link without a control plane: the userspace process died
			// (its TUN would be gone with it) or a foreign device squats
			// the name. Either way it cannot carry our tunnel.
			d.log.Warn("removing unresponsive wireguard link", zap.String("device", name))
			if err := netlink.LinkDel(l); err != nil {
				return fmt.Errorf("remove stale %s: %w", name, err)
			}
		}
		if err := d.create(); err != nil {
			return err
		}
	} else {
		l, err := netlink.LinkByName(name)
		if err != nil {
			// Userspace sockets are per host, links per network namespace:
			// configuring this device would reconfigure another node's.
			return fmt.Errorf("wireguard device %s answers on its control socket but has no link in this network namespace: another namespace uses the name; choose another --wireguard-device", name)
		}
		d.userspace = l.Type() == "tuntap"
		if want := d.cfg.Kind; (want == KindKernel && d.userspace) || (want == KindUserspace && !d.userspace) {
			// The kind was changed since the device was made: replacing it
			// costs the sessions one handshake.
			d.log.Warn("replacing the wireguard device of another kind", zap.String("device", name), zap.String("kind", want))
			if err := removeDevice(d.cfg.RunDir, name, d.log); err != nil {
				return err
			}
			if err := d.create(); err != nil {
				return err
			}
		}
	}
	dev, err := d.client.Device(name)
	if err != nil {
		return fmt.Errorf("wireguard %s: %w", name, err)
	}
	var c wgtypes.Config
	if dev.PrivateKey != d.key {
		c.PrivateKey = &d.key
	}
	if dev.ListenPort != d.cfg.ListenPort {
		c.ListenPort = &d.cfg.ListenPort
	}
	if dev.FirewallMark != FirewallMark {
		mark := FirewallMark
		c.FirewallMark = &mark
	}
	if c.PrivateKey != nil || c.ListenPort != nil || c.FirewallMark != nil {
		if err := d.client.ConfigureDevice(name, c); err != nil {
			return fmt.Errorf("configure %s: %w", name, err)
		}
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if d.cfg.MTU > 0 && l.Attrs().MTU != d.cfg.MTU {
		if err := netlink.LinkSetMTU(l, d.cfg.MTU); err != nil {
			return fmt.Errorf("set MTU of %s: %w", name, err)
		}
	}
	return netlink.LinkSetUp(l)
}

// create makes a kernel device, or starts the userspace process when the
// kernel has no WireGuard.
func (d *Device) create() error {
	if d.cfg.Kind == KindUserspace {
		d.userspace = true
		return d.startUserspace()
	}
	err := netlink.LinkAdd(&netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Name: d.cfg.Device, MTU: d.cfg.MTU}})
	if err == nil {
		d.userspace = false
		d.log.Info("kernel wireguard device created", zap.String("device", d.cfg.Device))
		return nil
	}
	if d.cfg.Kind == KindKernel {
		return kernelKindError(d.cfg.Device, err)
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.ENOENT) && !strings.Contains(err.Error(), "not supported") {
		return fmt.Errorf("create kernel wireguard %s: %w", d.cfg.Device, err)
	}
	d.userspace = true
	return d.startUserspace()
}

// kernelKindError says why KindKernel found no kernel device for device.
func kernelKindError(device string, err error) error {
	return fmt.Errorf("create kernel wireguard %s (--wireguard-device-kind=kernel; the kernel feature wireguard, docs/kernels.md): %w", device, err)
}

// PIDFile is where the userspace process records its PID (in the run dir).
func PIDFile(runDir, device string) string {
	return filepath.Join(runDir, "wireguard-"+device+".pid")
}

func (d *Device) startUserspace() error {
	bin := d.cfg.UserspaceBinary
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		bin = filepath.Join(filepath.Dir(self), "coordino-wireguard")
	}
	if err := os.MkdirAll(d.cfg.RunDir, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(d.cfg.RunDir, "wireguard-"+d.cfg.Device+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	mtu := d.cfg.MTU
	if mtu == 0 {
		mtu = 1420
	}
	args := []string{"--interface", d.cfg.Device, "--mtu", strconv.Itoa(mtu), "--pid-file", PIDFile(d.cfg.RunDir, d.cfg.Device)}
	if d.cfg.LogHandshakes {
		args = append(args, "--verbose")
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: signals to the daemon's group and the daemon's
	// death leave it running. Not its own session: with the kernel's
	// scheduler autogroups (on by default where tasks sit in the root
	// cgroup), a session is its own CPU group, and a device alone in one
	// forwarded at 0.6-0.7× of the same process sharing the daemon's
	// session (docs/benchmarks.md, userspace WireGuard).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // reaped while we live
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := d.client.Device(d.cfg.Device); err == nil {
			d.log.Info("userspace wireguard started", zap.String("device", d.cfg.Device), zap.Int("pid", cmd.Process.Pid))
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited at start; see %s", bin, logf.Name())
		case <-time.After(20 * time.Millisecond):
		}
	}
	_ = cmd.Process.Kill()
	return fmt.Errorf("%s did not open its UAPI socket within 10s", bin)
}

// Apply configures peers and routes from set. Every other node's blocks get
// a blackhole route behind the device's (routing.SyncBlackholes), installed
// first and kept when the daemon exits: a peer without a published key, or a
// device that is gone (the userspace process ended with the daemon's
// container), drops pod packets to those blocks where the node's default
// route would otherwise carry them in the clear. Only peers that changed are
// reconfigured, so established sessions of the others keep their keys.
func (d *Device) Apply(set peers.Set) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.last = set
	return d.switchAndApply(set)
}

// switchAndApply switches to the pending key if set carries it, then
// applies set; callers hold mu.
func (d *Device) switchAndApply(set peers.Set) error {
	// Taken before anything changes: a handshake may complete while the
	// device is still being configured, and it is the one settling waits
	// for.
	since := time.Now()
	switched, err := d.maybeSwitchKey(set)
	if err != nil {
		return err
	}
	return d.apply(set, since, switched)
}

// apply configures set's peers and routes; since is when the change began
// (handshakes after it count for settling) and rekeyed says this node's own
// key changed then, which makes every peer settle. Callers hold mu.
func (d *Device) apply(set peers.Set, since time.Time, rekeyed bool) error {
	// Before anything else, and whatever the device's state: the blocks
	// of a peer that is not usable yet must not fall to the default route.
	var errs []error
	if err := routing.SyncBlackholes(d.remoteBlocks(set), d.log); err != nil {
		errs = append(errs, fmt.Errorf("blackhole routes of the other nodes' blocks: %w", err))
	}
	dev, err := d.client.Device(d.cfg.Device)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("wireguard %s: %w", d.cfg.Device, err))...)
	}
	have := map[wgtypes.Key]wgtypes.Peer{}
	for _, p := range dev.Peers {
		have[p.PublicKey] = p
	}
	keyed := peers.Set{}
	var c wgtypes.Config
	want := map[wgtypes.Key]bool{}
	for _, name := range set.Names() {
		n := set[name]
		if name == d.cfg.Self {
			keyed[name] = n
			continue
		}
		if n.WireGuard == nil {
			d.log.Warn("peer has no wireguard key yet: its pods are unreachable (blackholed)", zap.String("peer", name))
			continue
		}
		key, err := wgtypes.ParseKey(n.WireGuard.PublicKey)
		// This node's own key (or its pending one) is no peer's: both
		// device kinds drop a peer with their own public key when the
		// private key is set.
		if err != nil || key == d.key.PublicKey() || (d.next != nil && key == d.next.PublicKey()) {
			errs = append(errs, fmt.Errorf("peer %q: unusable wireguard key", name))
			continue
		}
		pc, ok := d.peerConfig(n, key)
		if !ok {
			errs = append(errs, fmt.Errorf("peer %q: no endpoint (no address, no wireGuard.endpoint)", name))
			continue
		}
		keyed[name] = n
		want[key] = true
		if h, ok := have[key]; ok && samePeer(h, pc) {
			continue
		}
		c.Peers = append(c.Peers, pc)
	}
	for key := range have {
		if !want[key] {
			c.Peers = append(c.Peers, wgtypes.PeerConfig{PublicKey: key, Remove: true})
		}
	}
	if len(c.Peers) > 0 {
		if err := d.client.ConfigureDevice(d.cfg.Device, c); err != nil {
			return fmt.Errorf("configure peers of %s: %w", d.cfg.Device, err)
		}
	}
	if fresh := freshPeers(have, c.Peers, rekeyed); len(fresh) > 0 {
		go d.settle(fresh, since)
	}
	if err := d.router.Apply(keyed); err != nil {
		errs = append(errs, err)
	}
	if err := d.syncNodeRoutes(keyed); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// remoteBlocks are the blocks of every node in set but this one, keyed or
// not.
func (d *Device) remoteBlocks(set peers.Set) []netip.Prefix {
	var out []netip.Prefix
	for _, name := range set.Names() {
		if name != d.cfg.Self {
			out = append(out, set[name].Blocks...)
		}
	}
	return out
}

func (d *Device) peerConfig(n *peers.Node, key wgtypes.Key) (wgtypes.PeerConfig, bool) {
	ep := n.WireGuard.Endpoint
	if !ep.IsValid() {
		a, ok := n.Address(false)
		if !ok {
			if a, ok = n.Address(true); !ok {
				return wgtypes.PeerConfig{}, false
			}
		}
		ep = netip.AddrPortFrom(a, uint16(d.cfg.ListenPort))
	}
	pc := wgtypes.PeerConfig{PublicKey: key, ReplaceAllowedIPs: true, Endpoint: net.UDPAddrFromAddrPort(ep)}
	for _, b := range n.Blocks {
		pc.AllowedIPs = append(pc.AllowedIPs, net.IPNet{IP: b.Addr().AsSlice(), Mask: net.CIDRMask(b.Bits(), b.Addr().BitLen())})
	}
	if d.cfg.NodeToNode {
		for _, a := range n.Addresses {
			pc.AllowedIPs = append(pc.AllowedIPs, net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())})
		}
	}
	return pc, true
}

func samePeer(h wgtypes.Peer, w wgtypes.PeerConfig) bool {
	if h.Endpoint == nil || w.Endpoint == nil || h.Endpoint.AddrPort() != w.Endpoint.AddrPort() {
		return false
	}
	norm := func(ns []net.IPNet) []string {
		var out []string
		for _, n := range ns {
			out = append(out, n.String())
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(norm(h.AllowedIPs), norm(w.AllowedIPs))
}

// Run supervises the device until ctx is done: a userspace process that
// died is restarted (an external one waited for) and given the last peer
// set again.
func (d *Device) Run(ctx context.Context) {
	interval := superviseInterval
	if d.cfg.Kind == KindExternal {
		interval = superviseIntervalExternal
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var down time.Time // when the device stopped answering; zero while it answers
	reported := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if down.IsZero() {
			d.checkRotation()
		}
		if d.answersConfigured() {
			continue
		}
		if down.IsZero() {
			down = time.Now()
			d.log.Warn("wireguard device stopped answering: re-creating it", zap.String("device", d.cfg.Device), zap.String("kind", d.cfg.Kind))
		}
		d.mu.Lock()
		since := time.Now()
		err := d.ensure()
		if err == nil && d.last != nil {
			err = d.apply(d.last, since, false)
		}
		d.mu.Unlock()
		switch {
		case err == nil:
			d.log.Info("wireguard device answering again", zap.String("device", d.cfg.Device), zap.Duration("after", time.Since(down)))
			down, reported = time.Time{}, false
		case d.cfg.Kind != KindExternal || !reported:
			// An external device's absence is logged once, not every tick.
			d.log.Error("re-creating wireguard device", zap.Error(err))
			reported = true
		}
	}
}

// answersConfigured reports whether the device answers with this node's
// key: a device that answers without it is a new process (an external
// device's pod restarted between two checks) that knows no peers yet.
func (d *Device) answersConfigured() bool {
	dev, err := d.client.Device(d.cfg.Device)
	if err != nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return dev.PrivateKey == d.key || (d.next != nil && dev.PrivateKey == *d.next)
}

// Close releases the control client; the device keeps running.
func (d *Device) Close() error { return d.client.Close() }

// syncNodeRoutes routes peer node addresses through the tunnel (table
// NodeTable, consulted by every packet not sent by the device itself), or
// removes that steering when node-to-node encryption is off.
func (d *Device) syncNodeRoutes(keyed peers.Set) error {
	var want []netlink.Route
	if d.cfg.NodeToNode {
		l, err := netlink.LinkByName(d.cfg.Device)
		if err != nil {
			return err
		}
		for _, name := range keyed.Names() {
			if name == d.cfg.Self {
				continue
			}
			for _, a := range keyed[name].Addresses {
				dst := &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
				want = append(want, netlink.Route{Dst: dst, LinkIndex: l.Attrs().Index, Scope: netlink.SCOPE_LINK})
			}
		}
	}
	errs := routing.SyncTable(NodeTable, want, d.log)
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		if err := syncRule(fam, d.cfg.NodeToNode); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// syncRule ensures "not fwmark FirewallMark lookup NodeTable" exists (or not).
func syncRule(family int, present bool) error {
	rules, err := netlink.RuleList(family)
	if err != nil {
		return fmt.Errorf("list rules: %w", err)
	}
	mask := uint32(0xffffffff)
	want := netlink.NewRule()
	want.Family, want.Priority, want.Table, want.Mark, want.Mask, want.Invert = family, rulePriority, NodeTable, FirewallMark, &mask, true
	found := false
	for _, r := range rules {
		if r.Table != NodeTable {
			continue
		}
		if present && r.Priority == rulePriority && r.Mark == FirewallMark && r.Invert && !found {
			found = true
			continue
		}
		if err := netlink.RuleDel(&r); err != nil {
			return fmt.Errorf("delete rule %v: %w", r, err)
		}
	}
	if present && !found {
		if err := netlink.RuleAdd(want); err != nil {
			return fmt.Errorf("add rule %v: %w", want, err)
		}
	}
	return nil
}

// RemoveStale undoes what an earlier run with encryption left when the
// daemon now runs without it: the node-to-node rules and table, the
// blackholes of the other nodes' blocks, and the device (the userspace
// process is ended through its PID file). Without this, node-to-node
// traffic would keep flowing into an orphaned tunnel, and a block whose
// peer left would stay dropped.
func RemoveStale(cfg Config, log *zap.Logger) error {
	errs := routing.SyncTable(NodeTable, nil, log)
	if err := routing.RemoveBlackholes(log); err != nil {
		errs = append(errs, err)
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		if err := syncRule(fam, false); err != nil {
			errs = append(errs, err)
		}
	}
	name := cfg.Device
	if name == "" {
		name = DefaultDevice
	}
	if err := removeDevice(cfg.RunDir, name, log); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// removeDevice ends the userspace process of device name (through its PID
// file in runDir) and deletes its link, of either kind.
func removeDevice(runDir, name string, log *zap.Logger) error {
	if data, err := os.ReadFile(PIDFile(runDir, name)); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 0 && isUserspaceDevice(pid) {
			log.Info("stopping the userspace wireguard device of an earlier run", zap.String("device", name), zap.Int("pid", pid))
			_ = syscall.Kill(pid, syscall.SIGTERM)
			// Its TUN goes with it; wait so the link check below sees that.
			for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	if l, err := netlink.LinkByName(name); err == nil && (l.Type() == "wireguard" || l.Type() == "tuntap") {
		log.Info("removing the wireguard device of an earlier run", zap.String("device", name))
		if err := netlink.LinkDel(l); err != nil {
			return fmt.Errorf("remove %s: %w", name, err)
		}
	}
	return nil
}

// isUserspaceDevice guards against signalling a recycled PID.
func isUserspaceDevice(pid int) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	return err == nil && strings.HasSuffix(strings.TrimSuffix(exe, " (deleted)"), "/coordino-wireguard")
}
