package wireguard

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// TestDeviceKind: the device kind chooses the device whatever the kernel
// offers. userspace is a TUN served by coordino-wireguard; kernel is the
// kernel's wireguard link, which replaces a userspace device found at start
// and is adopted, not re-created, by the next start; where the kernel has
// no WireGuard, kernel is a start-up error naming the feature that leaves
// the running device alone.
func TestDeviceKind(t *testing.T) {
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
	hasModule := kernel.Probe().Has(kernel.WireGuard)
	cfg := Config{Self: "a", Device: "cwk" + harness.RandomSuffix(8), MTU: 1420, StateDir: dir,
		RunDir: filepath.Join(dir, "run"), UserspaceBinary: bin, KernelWireGuard: hasModule}
	log := zap.NewNop()
	t.Cleanup(func() {
		_ = netns.Do(func(ns.NetNS) error { return removeDevice(cfg.RunDir, cfg.Device, log) })
		_ = netns.Close()
		_ = testutils.UnmountNS(netns)
	})
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
