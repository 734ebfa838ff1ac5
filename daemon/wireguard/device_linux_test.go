package wireguard

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/daemon/peers"
	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// deviceFixture is what the device tests share: a network namespace of
// the test's own and the config of a device of a unique name (prefix and
// a random suffix) there, run by the coordino-wireguard of make build;
// whatever device of that name is left is removed at the end.
func deviceFixture(t *testing.T, prefix string) (ns.NetNS, Config, *zap.Logger) {
	t.Helper()
	privileged.Require(t)
	bin := filepath.Join(harness.BinDir(), "coordino-wireguard")
	if _, err := os.Stat(bin); err != nil {
		privileged.Needs(t, "%s missing: run make build", bin)
	}
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := Config{Self: "a", Device: prefix + harness.RandomSuffix(8), MTU: 1420, StateDir: dir,
		RunDir: filepath.Join(dir, "run"), UserspaceBinary: bin}
	log := zap.NewNop()
	t.Cleanup(func() {
		_ = netns.Do(func(ns.NetNS) error { return removeDevice(cfg.RunDir, cfg.Device, log) })
		_ = netns.Close()
		_ = testutils.UnmountNS(netns)
	})
	return netns, cfg, log
}

// TestDeviceKind: the device kind chooses the device whatever the kernel
// offers. userspace is a TUN served by coordino-wireguard; kernel is the
// kernel's wireguard link, which replaces a userspace device found at start
// and is adopted, not re-created, by the next start; where the kernel has
// no WireGuard, kernel is a start-up error naming the feature that leaves
// the running device alone.
func TestDeviceKind(t *testing.T) {
	netns, cfg, log := deviceFixture(t, "cwk")
	hasModule := kernel.Probe().Has(kernel.WireGuard)
	cfg.KernelWireGuard = hasModule
	// start starts a device of kind and returns its link's type and index.
	start := func(kind string) (typ string, index int, err error) {
		cfg.Kind = kind
		err = netns.Do(func(ns.NetNS) error {
			d, err := Start(cfg, log)
			if err != nil {
				return err
			}
			defer d.Close()
			l, err := netlink.LinkByName(cfg.Device)
			if err != nil {
				return err
			}
			typ, index = l.Type(), l.Attrs().Index
			if d.Userspace() != (typ == "tuntap") {
				t.Errorf("kind %s: Userspace() = %v for a %q link", kind, d.Userspace(), typ)
			}
			return nil
		})
		return typ, index, err
	}

	if typ, _, err := start(KindUserspace); err != nil || typ != "tuntap" {
		t.Fatalf("kind userspace: %q link, %v; want a TUN (tuntap)", typ, err)
	}
	data, err := os.ReadFile(PIDFile(cfg.RunDir, cfg.Device))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))

	typ, index, err := start(KindKernel)
	if !hasModule {
		if err == nil || !strings.Contains(err.Error(), "--wireguard-device-kind=kernel") || !strings.Contains(err.Error(), "wireguard, docs/kernels.md") {
			t.Fatalf("kind kernel on a kernel without WireGuard: %v; want an error naming the option and the feature", err)
		}
		// The running device keeps forwarding while the option is fixed.
		if syscall.Kill(pid, 0) != nil {
			t.Errorf("the userspace device's process %d was ended by a start that failed", pid)
		}
		if typ, _, err := start(KindAuto); err != nil || typ != "tuntap" {
			t.Errorf("kind auto after the failed start: %q link, %v; want the userspace TUN adopted", typ, err)
		}
		t.Skipf("the kernel has no %s (docs/kernels.md): the kernel device's cases cannot run", kernel.WireGuard)
	}
	if err != nil || typ != "wireguard" {
		t.Fatalf("kind kernel over a running userspace device: %q link, %v; want the kernel's (wireguard)", typ, err)
	}
	if pid > 0 && syscall.Kill(pid, 0) == nil {
		t.Errorf("the userspace device's process %d outlived its replacement", pid)
	}
	for _, kind := range []string{KindKernel, KindAuto} {
		if typ, again, err := start(kind); err != nil || typ != "wireguard" || again != index {
			t.Errorf("kind %s after kernel: %q link %d, %v; want the kernel's link %d adopted", kind, typ, again, err, index)
		}
	}
}

// TestExternalDevice: with kind external the daemon adopts the device
// another process runs and never ends it, so the device outlives the
// daemon; a second coordino-wireguard started with --wait-for-name takes the
// name over when the first ends, and the running daemon gives it the last
// peer set again; a start with no device fails naming the option.
func TestExternalDevice(t *testing.T) {
	netns, cfg, log := deviceFixture(t, "cwx")
	bin := cfg.UserspaceBinary
	cfg.UserspaceBinary, cfg.Kind = "", KindExternal
	exited := map[*exec.Cmd]chan struct{}{}
	t.Cleanup(func() {
		for p, done := range exited {
			_ = p.Process.Kill()
			<-done
		}
	})
	client, err := wgctrl.New()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// device runs coordino-wireguard in netns, as the DaemonSet's pod does.
	device := func(args ...string) *exec.Cmd {
		cmd := exec.Command(bin, append([]string{"--interface", cfg.Device}, args...)...)
		if err := netns.Do(func(ns.NetNS) error { return cmd.Start() }); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		exited[cmd] = done
		go func() { _ = cmd.Wait(); close(done) }()
		return cmd
	}
	alive := func(c *exec.Cmd) bool {
		select {
		case <-exited[c]:
			return false
		default:
			return true
		}
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 5s", what)
			}
		}
	}
	answers := func() bool { _, err := client.Device(cfg.Device); return err == nil }

	externalWait = 300 * time.Millisecond
	t.Cleanup(func() { externalWait = 60 * time.Second })
	if err := netns.Do(func(ns.NetNS) error { _, err := Start(cfg, log); return err }); err == nil || !strings.Contains(err.Error(), "--wireguard-device-kind=external") {
		t.Fatalf("start without a device: %v; want an error naming --wireguard-device-kind=external", err)
	}

	first := device()
	waitFor("first device", answers)
	second := device("--wait-for-name")
	time.Sleep(300 * time.Millisecond)
	if !alive(second) {
		t.Fatal("coordino-wireguard --wait-for-name exited while another process held the name; want it waiting")
	}

	var d *Device
	if err := netns.Do(func(ns.NetNS) error { d, err = Start(cfg, log); return err }); err != nil {
		t.Fatalf("start over the external device: %v", err)
	}
	peer, _ := wgtypes.GeneratePrivateKey()
	block := netip.MustParsePrefix("10.250.9.0/24")
	set := peers.Set{
		"a": {Name: "a", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")}},
		"b": {Name: "b", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.2")}, Blocks: []netip.Prefix{block},
			WireGuard: &peers.WireGuard{PublicKey: peer.PublicKey().String()}},
	}
	if err := netns.Do(func(ns.NetNS) error { return d.Apply(set) }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		_ = netns.Do(func(ns.NetNS) error { d.Run(ctx); return nil })
		close(ran)
	}()
	configured := func() bool {
		dev, err := client.Device(cfg.Device)
		if err != nil || len(dev.Peers) != 1 || dev.Peers[0].PublicKey != peer.PublicKey() || dev.PrivateKey != d.key {
			return false
		}
		routed := false
		_ = netns.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(cfg.Device)
			if err != nil {
				return err
			}
			rs, _ := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{LinkIndex: l.Attrs().Index}, netlink.RT_FILTER_OIF)
			for _, r := range rs {
				routed = routed || (r.Dst != nil && r.Dst.String() == block.String())
			}
			return nil
		})
		return routed
	}
	waitFor("configured device", configured)

	// The process the daemon adopted ends (its pod replaced): the waiting
	// one takes the name, and the daemon configures it again.
	_ = first.Process.Signal(syscall.SIGTERM)
	waitFor("hand-over to the waiting device", func() bool { return !alive(first) && configured() })
	if !alive(second) {
		t.Fatal("the waiting device exited instead of taking the name over")
	}

	// The daemon ends: the device is not its to end.
	cancel()
	<-ran
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if !alive(second) || !configured() {
		t.Fatal("the external device or its configuration did not outlive the daemon")
	}
}
