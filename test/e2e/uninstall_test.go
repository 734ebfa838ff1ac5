package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/masquerade"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/routing"
	"github.com/coordino/coordino/test/harness"
)

// uninstallNode runs `coordino-install --uninstall --remove-node-state` in
// the node's network namespace (as the privileged, host-network uninstall
// kit does) and returns its output.
func uninstallNode(t *testing.T, n *harness.Node) (string, error) {
	t.Helper()
	tmp := t.TempDir()
	cmd := exec.Command("nsenter", "--net="+n.NS.Path(), "--", filepath.Join(harness.BinDir(), "coordino-install"),
		"--uninstall", "--remove-node-state", "--cni-bin-dir", filepath.Join(tmp, "bin"), "--cni-conf-dir", filepath.Join(tmp, "net.d"),
		"--run-dir", n.RunDir, "--bpf-dir", n.BPFDir, "--state-dir", n.StateDir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// addForeignFilter puts another CNI's cls_bpf filter (a pass-all program)
// on ifname's ingress hook, next to Coordino's.
func addForeignFilter(t *testing.T, n *harness.Node, ifname string) {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	if err := n.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		return netlink.FilterAdd(&netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index,
			Parent: netlink.HANDLE_MIN_INGRESS, Handle: 1, Priority: 100, Protocol: unix.ETH_P_ALL},
			Fd: prog.FD(), Name: "othercni", DirectAction: true})
	}); err != nil {
		t.Fatal(err)
	}
}

// filterNames lists the cls_bpf filter names on ifname's clsact hooks and
// whether it still has a clsact qdisc.
func filterNames(t *testing.T, n *harness.Node, ifname string) (names []string, clsact bool) {
	t.Helper()
	if err := n.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		qs, err := netlink.QdiscList(l)
		if err != nil {
			return err
		}
		for _, q := range qs {
			clsact = clsact || q.Type() == "clsact"
		}
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, err := netlink.FilterList(l, parent)
			if err != nil && !errors.Is(err, unix.EINVAL) {
				return err
			}
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok {
					names = append(names, bf.Name)
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return names, clsact
}

func dirNames(ents []os.DirEntry) []string {
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestUninstallRemovesNodeState: with the daemon stopped, uninstall detaches
// Coordino's programs (cls_bpf and tcx) from every pod, leaves another CNI's
// filter alone, removes the BPF pins, the netns pins, the blackhole routes
// of encryption, the run files and the daemon's state (endpoint store), and
// the pods keep
// their network, now unpoliced. While the daemon runs it refuses. The old
// installer had no way to remove any of this.
func TestUninstallRemovesNodeState(t *testing.T) {
	for _, mode := range []string{"tc", "tcx"} {
		t.Run(mode, func(t *testing.T) {
			policyDir, err := harness.NewPolicyDir(t.TempDir(), "deny.yaml", strings.ReplaceAll(denyDBIngress, "{matchLabels: {role: db}}", "{}"))
			if err != nil {
				t.Fatal(err)
			}
			n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.87.0.0/24"}, ExtraArgs: []string{"--policy-dir", policyDir, "--attach-mode", mode}})
			c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
			_, rtA, addrsA := addPod(t, c, "a")
			b, rtB, _ := addPod(t, c, "b")
			hostA := netsetup.HostIfName("coordino", rtA.ContainerID, "eth0")
			hostB := netsetup.HostIfName("coordino", rtB.ContainerID, "eth0")
			if mode == "tc" {
				addForeignFilter(t, n, hostA)
			}
			probe := func() harness.Outcome {
				out, err := harness.ProbeAll([]harness.Probe{{From: b.NS, To: addrsA[0], Port: 9, Proto: "tcp"}}, 2*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				return out[0]
			}
			if o := probe(); o != harness.Blocked {
				t.Fatalf("b→a under default deny: %v", o)
			}

			masq := &masquerade.Table{NetNS: int(n.NS.Fd())}
			if _, ok, err := masq.Counters(); err != nil || !ok {
				t.Fatalf("masquerade table before uninstall: there %v, %v; want there (on by default)", ok, err)
			}
			// The blackholes an encrypted run keeps for other nodes' blocks.
			holes := []netip.Prefix{netip.MustParsePrefix("10.87.1.0/24"), netip.MustParsePrefix("fd00:87:1::/64")}
			if err := n.NS.Do(func(ns.NetNS) error { return routing.SyncBlackholes(holes, zap.NewNop()) }); err != nil {
				t.Fatal(err)
			}
			if out, err := uninstallNode(t, n); err == nil || !strings.Contains(out, "still running") {
				t.Fatalf("uninstall with the daemon running: %v\n%s", err, out)
			}
			if err := n.StopDaemon(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if out, err := uninstallNode(t, n); err != nil {
				t.Fatalf("uninstall: %v\n%s", err, out)
			}

			for _, host := range []string{hostA, hostB} {
				names, clsact := filterNames(t, n, host)
				want := []string(nil)
				if mode == "tc" && host == hostA {
					want = []string{"othercni"}
				}
				if strings.Join(names, ",") != strings.Join(want, ",") {
					t.Errorf("%s: filters %v after uninstall, want %v", host, names, want)
				}
				if clsact != (want != nil) {
					t.Errorf("%s: clsact present = %v, want %v (kept only for the other CNI's filter)", host, clsact, want != nil)
				}
				in, eg, err := n.TCXPrograms(host)
				if err != nil || in+eg != 0 {
					t.Errorf("%s: tcx programs ingress=%d egress=%d after uninstall (%v)", host, in, eg, err)
				}
			}
			if _, err := os.Stat(n.BPFDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("BPF dir %s still exists: %v", n.BPFDir, err)
			}
			if pins, err := n.Pins(); err != nil || len(pins) != 0 {
				t.Errorf("netns pins left: %v %v", pins, err)
			}
			if _, ok, err := masq.Counters(); err != nil || ok {
				t.Errorf("masquerade table after uninstall: there %v, %v", ok, err)
			}
			if err := n.NS.Do(func(ns.NetNS) error {
				left, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: routing.BlackholeProtocol, Table: unix.RT_TABLE_MAIN},
					netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
				if err == nil && len(left) > 0 {
					err = fmt.Errorf("%d blackhole routes left after uninstall: %v", len(left), left)
				}
				return err
			}); err != nil {
				t.Error(err)
			}
			// Nothing of the daemon's is left in its run and state dirs.
			for _, dir := range []string{n.RunDir, n.StateDir} {
				if ents, err := os.ReadDir(dir); err != nil || len(ents) != 0 {
					t.Errorf("%s after uninstall: %v %v", dir, dirNames(ents), err)
				}
			}
			// Pods keep their network, without policy: b now reaches a's kernel.
			if o := probe(); o != harness.Refused {
				t.Fatalf("b→a after uninstall: %v, want refused by a's kernel (unpoliced, connected)", o)
			}
			// Idempotent.
			if out, err := uninstallNode(t, n); err != nil {
				t.Fatalf("second uninstall: %v\n%s", err, out)
			}
		})
	}
}
