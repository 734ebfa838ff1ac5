package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/test/harness"
)

// chainConf builds a conflist: a primary plugin with host-local IPAM, Coordino, then extras.
func chainConf(t *testing.T, n *harness.Node, name, version string, primary map[string]any, subnet string, extras ...map[string]any) []byte {
	t.Helper()
	primary["ipam"] = map[string]any{"type": "host-local", "ranges": [][]map[string]any{{{"subnet": subnet}}},
		"dataDir": filepath.Join(n.Dir, "host-local-"+name)}
	plugins := []map[string]any{primary, {"type": "coordino", "runDir": n.RunDir}}
	plugins = append(plugins, extras...)
	b, err := json.Marshal(map[string]any{"cniVersion": version, "name": name, "plugins": plugins})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func bridgePlugin(br string) map[string]any {
	return map[string]any{"type": "bridge", "bridge": br, "isGateway": true, "ipMasq": false}
}

func TestChained(t *testing.T) {
	n := newNode(t, harness.NodeOptions{}) // no --pod-cidr: a chained-only node
	cases := []struct {
		name, version string
		primary       map[string]any
		subnet        string
		extras        []map[string]any
		binDirs       []string
	}{
		{"bridge-v110", "1.1.0", bridgePlugin("cbr110"), "10.92.1.0/24", nil, nil},
		{"bridge-v100", "1.0.0", bridgePlugin("cbr100"), "10.92.2.0/24", nil, nil},
		{"ptp-v110", "1.1.0", map[string]any{"type": "ptp"}, "10.92.3.0/24", nil, nil},
		{"bridge-portmap", "1.1.0", bridgePlugin("cbrpm"), "10.92.4.0/24",
			[]map[string]any{{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}}}, nil},
		{"debian-bridge-v100", "1.0.0", bridgePlugin("cbrdeb"), "10.92.5.0/24", nil,
			[]string{harness.BinDir(), harness.DebianBinDir}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.binDirs != nil {
				if _, err := os.Stat(filepath.Join(harness.DebianBinDir, "bridge")); err != nil {
					t.Fatalf("Debian containernetworking-plugins missing (hack/deps.sh installs it): %v", err)
				}
			}
			conf := chainConf(t, n, tc.name, tc.version, tc.primary, tc.subnet, tc.extras...)
			c, err := n.NewCNI(conf, tc.binDirs...)
			if err != nil {
				t.Fatal(err)
			}
			subnet := netip.MustParsePrefix(tc.subnet)
			a := newPod(t, "a")
			rtA := harness.RuntimeConf(a, "eth0")
			b := newPod(t, "b")
			rtB := harness.RuntimeConf(b, "eth0")
			resA, err := c.Add(ctx(t), rtA)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if _, err := c.Add(ctx(t), rtB); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if resA.Version() != tc.version {
				t.Fatalf("result version %s, want %s", resA.Version(), tc.version)
			}
			// Addressing is the primary's: Coordino passed prevResult through.
			curA, _ := current.NewResultFromResult(resA)
			addrsA, _ := harness.Addresses(resA)
			if len(addrsA) != 1 || !subnet.Contains(addrsA[0]) || !hasSandboxIface(curA, a.NS.Path()) {
				t.Fatalf("chained result does not carry the primary's addressing: %s", harness.ResultJSON(resA))
			}
			resB, _ := c.Config.GetNetworkListCachedResult(c.List, rtB)
			addrsB, _ := harness.Addresses(resB)

			// Same-node pod↔pod through the primary's datapath.
			stop, err := harness.Serve(a.NS, addrsA[0], 80, "a")
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			if got, err := harness.Dial(b.NS, addrsA[0], 80); err != nil || got != "a" {
				t.Fatalf("pod→pod: %q %v", got, err)
			}
			if v, err := n.Metric("coordino_endpoints", `mode="chained"`); err != nil || v < 2 {
				t.Fatalf("chained endpoints recorded = %v %v", v, err)
			}
			if err := c.Check(ctx(t), rtA); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
			if tc.version == "1.1.0" {
				if err := c.Status(ctx(t)); err != nil {
					t.Fatalf("STATUS on a chained-only node: %v", err)
				}
				fresh, _ := n.NewCNI(conf, tc.binDirs...)
				if err := fresh.GC(ctx(t), []types.GCAttachment{{ContainerID: rtA.ContainerID, IfName: "eth0"}}); err != nil {
					t.Fatalf("GC: %v", err)
				}
				// B's Coordino record is gone but the primary's interface is not Coordino's to remove.
				if err := checkCoordinoOnly(n, tc.name, tc.version, rtB.ContainerID, b.NS.Path(), resB); err == nil || !strings.Contains(err.Error(), "no Coordino attachment") {
					t.Fatalf("after GC, Coordino CHECK of B = %v", err)
				}
				if !linkExists(b.NS, "eth0") {
					t.Fatal("GC removed the primary plugin's interface")
				}
				if err := c.Check(ctx(t), rtA); err != nil {
					t.Fatalf("GC broke a valid chained attachment: %v", err)
				}
			}
			_ = addrsB

			// DEL (libcni runs the list in reverse): Coordino's record goes, then the primary's interface.
			if err := c.Del(ctx(t), rtA); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if err := checkCoordinoOnly(n, tc.name, tc.version, rtA.ContainerID, a.NS.Path(), resA); err == nil {
				t.Fatal("Coordino still has the attachment after DEL")
			}
			if linkExists(a.NS, "eth0") {
				t.Fatal("primary's DEL did not run after Coordino's")
			}
			_ = c.Del(ctx(t), rtB)
		})
	}
}

// TestChainedCheckAfterPrimaryBroken: Coordino's own CHECK notices the pod
// interface from prevResult is gone.
func TestChainedCheckAfterPrimaryBroken(t *testing.T) {
	n := newNode(t, harness.NodeOptions{})
	conf := chainConf(t, n, "brk", "1.1.0", bridgePlugin("cbrbrk"), "10.92.6.0/24")
	c, err := n.NewCNI(conf)
	if err != nil {
		t.Fatal(err)
	}
	p := newPod(t, "p")
	rt := harness.RuntimeConf(p, "eth0")
	res, err := c.Add(ctx(t), rt)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.LinkDel(l)
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Check(ctx(t), rt); err == nil {
		t.Fatal("CHECK passed with the pod interface gone")
	}
	err = checkCoordinoOnly(n, "brk", "1.1.0", rt.ContainerID, p.NS.Path(), res)
	if err == nil || !strings.Contains(err.Error(), "eth0") {
		t.Fatalf("Coordino CHECK = %v, want it to name eth0", err)
	}
	if err := c.Del(ctx(t), rt); err != nil {
		t.Fatalf("DEL after the interface vanished: %v", err)
	}
}

// TestChainedNonVethPrimaryIsRefused: macvlan has no host-side peer; the
// error says so and Coordino keeps no state.
func TestChainedNonVethPrimaryIsRefused(t *testing.T) {
	n := newNode(t, harness.NodeOptions{})
	conf := chainConf(t, n, "mv", "1.1.0", map[string]any{"type": "macvlan", "master": "uplink0", "mode": "bridge"}, "10.92.7.0/24")
	c, err := n.NewCNI(conf)
	if err != nil {
		t.Fatal(err)
	}
	p := newPod(t, "p")
	rt := harness.RuntimeConf(p, "eth0")
	_, err = c.Add(ctx(t), rt)
	var e *types.Error
	if !asCNI(err, &e) || e.Code != types.ErrInvalidNetworkConfig || !strings.Contains(e.Msg, "macvlan") || !strings.Contains(e.Msg, "veth") {
		t.Fatalf("ADD after macvlan = %v", err)
	}
	if v, err := n.Metric("coordino_endpoints", `mode="chained"`); err != nil || v != 0 {
		t.Fatalf("Coordino kept state for a refused attachment: %v %v", v, err)
	}
	_ = c.Del(ctx(t), rt)
}

// checkCoordinoOnly runs Coordino's CHECK alone with res as prevResult.
func checkCoordinoOnly(n *harness.Node, network, version, containerID, netns string, res types.Result) error {
	conv, err := res.GetAsVersion(version)
	if err != nil {
		return err
	}
	raw, _ := json.Marshal(conv)
	var prev map[string]any
	_ = json.Unmarshal(raw, &prev)
	stdin := pluginConf(n.RunDir, map[string]any{"name": network, "cniVersion": version, "prevResult": prev})
	_, cniErr, _, err := harness.ExecPlugin(harness.Invocation{Command: "CHECK", ContainerID: containerID, Netns: netns, IfName: "eth0", Stdin: stdin})
	if err != nil {
		return err
	}
	if cniErr != nil {
		return fmt.Errorf("code %d: %s", cniErr.Code, cniErr.Msg)
	}
	return nil
}

func hasSandboxIface(res *current.Result, sandbox string) bool {
	for _, i := range res.Interfaces {
		if i.Name == "eth0" && i.Sandbox == sandbox {
			return true
		}
	}
	return false
}

func linkExists(netns ns.NetNS, name string) bool {
	found := false
	_ = netns.Do(func(ns.NetNS) error {
		_, err := netlink.LinkByName(name)
		found = err == nil
		return nil
	})
	return found
}
