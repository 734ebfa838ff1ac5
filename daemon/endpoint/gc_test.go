package endpoint

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/daemon/ipam"
	nsfile "github.com/coordino/coordino/daemon/netns"
	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// newTestNS is a throwaway network namespace (a harness pod) removed at test end.
func newTestNS(t *testing.T) ns.NetNS {
	t.Helper()
	p, err := harness.NewPod("ns")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p.NS
}

// newTestManager is a Manager without datapath whose pins live in a temp dir.
func newTestManager(t *testing.T, cidr string) *Manager {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	pool, err := ipam.NewPool([]netip.Prefix{netip.MustParsePrefix(cidr)})
	if err != nil {
		t.Fatal(err)
	}
	pinDir := filepath.Join(t.TempDir(), "netns")
	t.Cleanup(func() {
		pins, _ := nsfile.ListPins(pinDir)
		for _, p := range pins {
			_ = nsfile.Unpin(p)
		}
	})
	return New(Config{PinDir: pinDir, Pool: pool, Store: st, Network: Host{}, DefaultMTU: 1500})
}

func addInvocation(key store.Key, netnsPath string) *request.Invocation {
	return &request.Invocation{Verb: request.Add, Key: key, Netns: netnsPath, Conf: &request.NetConf{}, PodNamespace: "default"}
}

// TestOrphanSweepSparesAttachmentRecreatedMeanwhile: a container restart
// (DEL then ADD of the same key, as podman restart does) lands inside a GC
// orphan sweep: the DEL after the sweep listed the kernel, the ADD after the
// sweep decided the old veth and pin were orphans. The sweep must not remove
// the fresh veth and pin, which carry the same derived names. Without the
// per-key lock and the re-read under it, it did.
func TestOrphanSweepSparesAttachmentRecreatedMeanwhile(t *testing.T) {
	privileged.Require(t)
	node := newTestNS(t)
	oldPod, newPod := newTestNS(t), newTestNS(t)
	m := newTestManager(t, "10.99.0.0/24")
	key := store.Key{Network: "net", ContainerID: "restarted", IfName: "eth0"}

	err := node.Do(func(ns.NetNS) error {
		if _, err := m.Add(context.Background(), addInvocation(key, oldPod.Path())); err != nil {
			return err
		}
		testHookSweep = func(s sweepStage) {
			switch s {
			case sweepKernelListed:
				if err := m.Del(context.Background(), &request.Invocation{Verb: request.Del, Key: key}); err != nil {
					t.Errorf("DEL inside the sweep: %v", err)
				}
			case sweepOrphansFound:
				if _, err := m.Add(context.Background(), addInvocation(key, newPod.Path())); err != nil {
					t.Errorf("ADD inside the sweep: %v", err)
				}
			}
		}
		defer func() { testHookSweep = nil }()
		if err := m.ReclaimOrphans(context.Background()); err != nil {
			t.Errorf("sweep: %v", err)
		}
		testHookSweep = nil
		ep, err := m.cfg.Store.Get(key)
		if err != nil {
			t.Fatalf("record of the new attachment: %v", err)
		}
		if _, err := netlink.LinkByName(ep.HostIfName); err != nil {
			t.Errorf("the sweep removed the new attachment's host veth %s: %v", ep.HostIfName, err)
		}
		if err := nsfile.Verify(ep.PinPath); err != nil {
			t.Errorf("the sweep removed the new attachment's netns pin: %v", err)
		}
		return m.Check(context.Background(), &request.Invocation{Verb: request.Check, Key: key, Netns: newPod.Path(), Conf: &request.NetConf{}})
	})
	if err != nil {
		t.Fatal(err)
	}
}
