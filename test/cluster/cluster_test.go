//go:build linux && clustere2e

// The cluster e2e is built only with the clustere2e tag (make
// e2e-cluster-smoke): it needs test/testbed/build.sh cluster, make image and
// the machine's one cluster bed, so a plain go test does not list it.

package cluster

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coordino/coordino/test/privileged"
	"github.com/coordino/coordino/test/testbed"
)

// requireCluster: the cluster e2e needs root.
func requireCluster(t *testing.T) { privileged.Require(t) }

// hostFootprint is what the cluster may change on the host (its kinds of
// names only: other tests run on the host at the same time); Down must
// restore it exactly.
func hostFootprint(t *testing.T, dir string) string {
	var parts []string
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "cb-") {
			parts = append(parts, "netns:"+e.Name())
		}
	}
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, "cbh-") {
			parts = append(parts, "link:"+i.Name)
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	ours := []string{dir, "/run/netns/cb-", "/sys/fs/bpf"}
	for _, p := range nodePaths {
		if p != "/run/netns" { // other tests' namespaces live there
			ours = append(ours, p)
		}
	}
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		if len(f) <= 4 {
			continue
		}
		for _, p := range ours {
			if strings.HasPrefix(f[4], p) {
				parts = append(parts, "mount:"+f[4])
				break
			}
		}
	}
	for _, p := range nodePaths {
		if _, err := os.Stat(p); err == nil {
			parts = append(parts, "path:"+p)
		}
	}
	cg, _ := os.ReadDir("/sys/fs/cgroup/memory")
	for _, e := range cg {
		if strings.HasPrefix(e.Name(), "coordino-cluster-") {
			parts = append(parts, "cgroup:"+e.Name())
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, "\n")
}

// TestClusterSmoke: two workers, Coordino installed with kubectl apply -k,
// pod-to-pod on one node and across nodes, one NetworkPolicy case, and a
// tear-down that leaves the host as it was.
func TestClusterSmoke(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	dir := t.TempDir() + "/c"
	before := hostFootprint(t, dir)
	start := time.Now()
	c, err := Up(ctx, Options{Dir: dir, Workers: 2, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster up in %s", time.Since(start).Round(time.Second))
	defer func() {
		if err := c.Down(); err != nil {
			t.Errorf("down: %v", err)
		}
		if after := hostFootprint(t, dir); after != before {
			t.Errorf("host changed by the cluster:\n%s", diffLines(before, after))
		}
	}()
	podNetworkAndPolicy(ctx, t, c, "smoke")
}

// podNetworkAndPolicy checks pod-to-pod on one node and across nodes and
// one NetworkPolicy case (ingress to a server only from role=client) in a
// fresh namespace.
func podNetworkAndPolicy(ctx context.Context, t *testing.T, c *Cluster, ns string) {
	t.Helper()
	w1, w2 := c.Nodes[0], c.Nodes[1]
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	server, err := c.Server(ctx, ns, "server", w1, map[string]string{"app": "server"})
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(server, fmt.Sprint(ServerPort))
	connect := func(name, node string, labels map[string]string) bool {
		t.Helper()
		ok, err := c.Connect(ctx, ns, name, node, addr, labels)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !connect("same-node", w1, nil) {
		t.Fatalf("pod on %s cannot reach pod %s on the same node", w1, addr)
	}
	// Cross-node pod-to-pod in primary mode needs the daemon's
	// NodeConfig-based peers.
	crossNode := connect("cross-node", w2, nil)
	if !crossNode {
		t.Errorf("pod on %s cannot reach pod %s on %s (cross-node routing in Kubernetes mode)", w2, addr, w1)
	}

	// NetworkPolicy: ingress to the server only from role=client.
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "server-from-clients", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}},
			}}}},
		},
	}
	if _, err := c.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Enforcement is asynchronous (controller compiles, daemons apply):
	// the first denied attempt may come a little later.
	denied := false
	for i := 0; i < 6 && !denied; i++ {
		denied = !connect(fmt.Sprintf("denied-%d", i), w1, nil)
	}
	if !denied {
		t.Errorf("pod without role=client still reaches the isolated server")
	}
	if !connect("allowed", w1, map[string]string{"role": "client"}) {
		t.Errorf("pod with role=client is denied by a policy that allows it")
	}
	if crossNode && !connect("allowed-cross-node", w2, map[string]string{"role": "client"}) {
		t.Errorf("pod with role=client on %s is denied by a policy that allows it", w2)
	}
}

func diffLines(a, b string) string {
	return strings.Join(diffSets(strings.Split(a, "\n"), strings.Split(b, "\n")), "\n")
}

// TestClusterChainedUninstall: over a bridge + host-local primary, the
// chained overlay brings pods' networking under Coordino's policy, and the
// documented uninstall kit leaves every node as it was before the install:
// no Coordino config, plugin, BPF pin, program, netns pin, run or state
// file; the primary's config byte for byte.
func TestClusterChainedUninstall(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	c, err := Up(ctx, Options{Dir: t.TempDir() + "/c", Workers: 2, Logf: t.Logf, SkipInstall: true, PrimaryCNI: "bridge",
		Overlay: filepath.Join(mustRepoRoot(t), "install", "kubernetes", "overlays", "chained")})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Down(); err != nil {
			t.Errorf("down: %v", err)
		}
	}()
	// The primary alone first: one pod per node, so the nodes hold what the
	// primary leaves (its bridge), then the state Coordino must give back.
	const bare = "bare"
	if err := c.CreateNamespace(ctx, bare); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		if _, err := c.Server(ctx, bare, "primary-"+n, n, nil); err != nil {
			t.Fatalf("pod on %s with the primary CNI alone: %v", n, err)
		}
	}
	deleteNamespace(ctx, t, c, bare)
	before, err := c.SettledFootprints(ctx, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	if err := c.Install(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		fp, err := c.NodeFootprint(n)
		if err != nil {
			t.Fatal(err)
		}
		if !hasPrefix(fp, "file /etc/cni/net.d/00-coordino-chained.conflist ") {
			t.Fatalf("%s has no chained conflist after install:\n%s", n, strings.Join(fp, "\n"))
		}
	}
	podNetworkAndPolicy(ctx, t, c, "chained")
	if t.Failed() {
		return
	}

	// Users drain Coordino's pods before removing it; CoreDNS is the
	// install's and goes with it.
	deleteNamespace(ctx, t, c, "chained")
	if _, err := c.Kubectl(ctx, "-n", "kube-system", "delete", "deployment/coredns", "--wait=true"); err != nil {
		t.Fatal(err)
	}
	if err := c.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	err = testbed.WaitFor(ctx, "nodes as before the install", 2*time.Minute, func() error {
		var diffs []string
		for _, n := range c.Nodes {
			fp, err := c.NodeFootprint(n)
			if err != nil {
				return err
			}
			for _, d := range before[n].Diff(fp) {
				diffs = append(diffs, n+": "+d)
			}
		}
		if len(diffs) > 0 {
			return fmt.Errorf("nodes changed by install + uninstall:\n%s", strings.Join(diffs, "\n"))
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	// And the primary alone still networks new pods.
	if err := c.CreateNamespace(ctx, "after"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Server(ctx, "after", "primary-again", c.Nodes[0], nil); err != nil {
		t.Errorf("pod with the primary CNI after uninstall: %v", err)
	}
}

func hasPrefix(lines []string, prefix string) bool {
	return slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, prefix) })
}

func mustRepoRoot(t *testing.T) string {
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// deleteNamespace deletes ns and waits until it and its pods are gone.
func deleteNamespace(ctx context.Context, t *testing.T, c *Cluster, ns string) {
	t.Helper()
	if _, err := c.Kubectl(ctx, "delete", "namespace", ns, "--wait=true", "--timeout=3m"); err != nil {
		t.Fatal(err)
	}
}
