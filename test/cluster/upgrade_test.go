//go:build linux && clustere2e

package cluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coordino/coordino/test/testbed"
)

// Images of the upgrade: the previous release's own make image under
// another tag (hack/build-previous.sh --image), and this tree's.
const (
	previousTag = "previous"
	currentTag  = "dev"
	// maxStreamGap is the longest silence a flow may see during the roll.
	maxStreamGap = time.Second
)

// upgradeKustomization installs overlay with the Coordino image of tag.
// With onDelete the DaemonSet replaces a node's pod only when the test
// deletes it, so the roll goes node by node with checks between. With
// encryption wireguard every daemon encrypts cross-node traffic with the
// userspace device (the bed's kernel has no WireGuard module): through
// WireGuardComponent, the device's own DaemonSet, where the release has it,
// else with the daemon's flags, which put the device in the daemon's
// container.
const upgradeKustomization = `# Written by TestClusterUpgrade.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {{.Overlay}}
{{- if .WireGuardComponent}}
components:
  - {{.WireGuardComponent}}
{{- end}}
images:
  - name: coordino/coordino
    newTag: {{.Tag}}
{{- if or .OnDelete .WireGuard}}
patches:
  - target:
      group: apps
      version: v1
      kind: DaemonSet
      name: coordino
    patch: |-
{{- if .OnDelete}}
      - op: replace
        path: /spec/updateStrategy
        value: {type: OnDelete}
{{- end}}
{{- if .WireGuard}}
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --encryption=wireguard
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --wireguard-device-kind=userspace
{{- end}}
{{- end}}
`

// wireGuardComponent is the release's component that runs the userspace
// WireGuard device in its own DaemonSet, relative to its overlays.
const wireGuardComponent = "../../components/wireguard-userspace"

// hasWireGuardComponent says whether the release whose overlay is overlay
// has wireGuardComponent (releases before it put the device in the daemon's
// container).
func hasWireGuardComponent(overlay string) bool {
	_, err := os.Stat(filepath.Join(overlay, wireGuardComponent, "kustomization.yaml"))
	return err == nil
}

func writeKustomization(t *testing.T, dir, overlay, tag string, onDelete bool, encryption string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, overlay)
	if err != nil {
		t.Fatal(err)
	}
	data := map[string]any{"Overlay": rel, "Tag": tag, "OnDelete": onDelete, "WireGuard": false, "WireGuardComponent": ""}
	if encryption == "wireguard" {
		if hasWireGuardComponent(overlay) {
			data["WireGuardComponent"] = filepath.Join(rel, wireGuardComponent)
		} else {
			data["WireGuard"] = true
		}
	}
	k, err := render(upgradeKustomization, data)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestClusterUpgrade (make e2e-upgrade): the bed installed from the
// previous release (its image and its manifests), long-lived cross-node
// TCP connections and UDP streams plus probes the policy denies, then the
// controller and the DaemonSet rolled to this tree's image node by node,
// each node's new daemon replaced once more (a restart), then rolled back
// the same way. Throughout: no connection reset, no flow
// silent over a second, no denied probe through; after each step the
// nodes' endpoints, veths and map entries match the pods, a pod created
// on the rolled node gets networking, and after the roll back each node's
// footprint (links, pins, files, map entries) is the one before the
// upgrade.
func TestClusterUpgrade(t *testing.T) {
	requireCluster(t)
	prev := os.Getenv("COORDINO_UPGRADE_PREVIOUS")
	if prev == "" {
		t.Fatal("COORDINO_UPGRADE_PREVIOUS unset: run make e2e-upgrade, which builds the previous release's image")
	}
	// COORDINO_UPGRADE_ENCRYPTION (make e2e-upgrade ENCRYPTION=wireguard):
	// the same roll with every daemon encrypting, and the underlay watched
	// for pod traffic in the clear.
	encryption := os.Getenv("COORDINO_UPGRADE_ENCRYPTION")
	if encryption != "" && encryption != "none" && encryption != "wireguard" {
		t.Fatalf("COORDINO_UPGRADE_ENCRYPTION %q: want none or wireguard", encryption)
	}
	wg := encryption == "wireguard"
	repo := mustRepoRoot(t)
	current := filepath.Join(repo, "bin", "coordino-image.tar")
	ctx, cancel := context.WithTimeout(context.Background(), 28*time.Minute)
	defer cancel()
	// Not t.TempDir: the logs of a failed run (SavedLogsDir) must outlive it.
	dir, err := os.MkdirTemp("", "coordino-upgrade-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if !t.Failed() {
			os.RemoveAll(dir)
		}
	}()
	prevOverlay := filepath.Join(prev, "manifests", "install", "kubernetes", "overlays", "primary")
	prevKz := writeKustomization(t, filepath.Join(dir, "kz-previous"), prevOverlay, previousTag, false, encryption)
	// A previous release that runs the userspace device in the daemon's
	// container ends it with each of its daemons' pods: the silence and
	// the cleartext of those replacements are that release's, reported,
	// not this tree's. Every other step is held to the limits.
	prevEndsDevice := wg && !hasWireGuardComponent(prevOverlay)
	curKz := writeKustomization(t, filepath.Join(dir, "kz-current"), filepath.Join(repo, "install", "kubernetes", "overlays", "primary"), currentTag, true, encryption)
	start := time.Now()
	c, err := Up(ctx, Options{Dir: dir + "/c", Workers: 2, ImageArchive: filepath.Join(prev, "coordino-image.tar"),
		ExtraImages: []string{current}, Overlay: prevKz, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster up on the previous release in %s", time.Since(start).Round(time.Second))
	defer func() {
		if t.Failed() {
			_ = c.saveLogs()
			t.Logf("logs kept in %s", SavedLogsDir(c.Dir))
		}
		if err := c.Down(); err != nil {
			t.Errorf("down: %v", err)
		}
	}()
	w1, w2 := c.Nodes[0], c.Nodes[1]
	const ns = "upgrade"
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}

	// A server, a client and a denied pod on each node; the servers take
	// ingress from role=client only.
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "servers-from-clients", Namespace: ns},
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
	type pod struct {
		name, node string
		addr       netip.Addr
		ns         netns.NsHandle
	}
	var servers, clients, denied []*pod
	for _, node := range c.Nodes {
		for _, p := range []struct {
			role string
			list *[]*pod
			lbl  map[string]string
		}{{"server", &servers, map[string]string{"app": "server"}}, {"client", &clients, map[string]string{"role": "client"}}, {"denied", &denied, map[string]string{"role": "denied"}}} {
			name := p.role + "-" + node
			addr, err := c.pausePod(ctx, ns, name, node, p.lbl)
			if err != nil {
				t.Fatal(err)
			}
			h, err := c.PodNetns(node, addr)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			*p.list = append(*p.list, &pod{name, node, addr, h})
		}
	}
	var watch *UnderlayWatch
	if wg {
		for _, node := range c.Nodes {
			if err := c.wireGuardUserspace(node); err != nil {
				t.Fatal(err)
			}
		}
		// From before the first flow to the end: every frame on each
		// node's underlay interface.
		if watch, err = c.WatchUnderlay(); err != nil {
			t.Fatal(err)
		}
		defer watch.Stop()
	}
	tr := NewTraffic(9400, 9401)
	for _, s := range servers {
		if err := tr.Serve(s.ns); err != nil {
			t.Fatal(err)
		}
	}
	// The policy in force before counting: a denied pod's connections
	// time out on every server. Only then are its packets counted.
	for _, d := range denied {
		for _, s := range servers {
			if err := waitDenied(ctx, d.ns, s.addr, tr.TCPPort); err != nil {
				t.Fatalf("%s -> %s: %v", d.name, s.name, err)
			}
		}
	}
	for _, d := range denied {
		tr.Deny(d.addr)
	}
	for _, cl := range clients {
		for _, s := range servers {
			if err := tr.Flow(cl.ns, s.addr); err != nil {
				t.Fatalf("%s -> %s: %v", cl.name, s.name, err)
			}
		}
	}
	for _, d := range denied {
		for _, s := range servers {
			tr.Probe(d.ns, s.addr)
		}
	}
	defer tr.Stop()
	time.Sleep(3 * time.Second)
	lastWire := map[string]UnderlayCount{}
	// prevExitLeak counts, per node, the pod frames in the clear that
	// node sent while the previous release's daemon was replaced there:
	// that release has no blackholes behind the device's routes, and its
	// userspace device ends with its pod (docs/operations.md). Reported,
	// not failed: it is the old code's exit, which no newer image can
	// change. Every other step, including each exit of this tree's daemon
	// in the roll back, must put no pod packet on the wire in the clear.
	prevExitLeak := map[string]uint64{}
	// Only a previous release without them (hack/build-previous.sh names
	// its directory after the commit) has its exits reported apart.
	prevFailsOpen := false
	if wg {
		prevCommit := strings.TrimSuffix(filepath.Base(prev), "-image")
		prevFailsOpen = exec.Command("git", "-C", repo, "cat-file", "-e", prevCommit+":daemon/routing/blackhole_linux.go").Run() != nil
		t.Logf("previous release %s has the blackholes: %v (without them its daemon's exits are reported, not failed)", prevCommit, !prevFailsOpen)
	}
	var lastCheck time.Time
	// The longest silence of the steps where the previous release's
	// device ended with its daemon's pod (prevEndsDevice).
	var inheritedGap time.Duration
	// check judges the traffic since the last check; prevExit names the
	// node whose previous-release daemon exited during the step ("": none).
	check := func(step, prevExit string) {
		t.Helper()
		r := tr.Report()
		for _, sl := range r.Silences {
			if !sl.End.After(lastCheck) {
				continue
			}
			t.Logf("%s: %s", step, sl)
			switch {
			case prevExit != "" && prevEndsDevice:
				inheritedGap = max(inheritedGap, sl.Len)
			case sl.Len > maxStreamGap:
				t.Errorf("%s: %s (over %s)", step, sl, maxStreamGap)
			}
		}
		lastCheck = time.Now()
		if wg {
			// Since the last check: no pod packet readable on the wire,
			// and WireGuard frames through each node's underlay.
			for node, n := range watch.Counts() {
				for src, total := range n.ClearFrom {
					d := total - lastWire[node].ClearFrom[src]
					switch {
					case d == 0:
					case src == prevExit && prevFailsOpen:
						t.Logf("%s: %d pod-to-pod frames from %s in the clear on %s's underlay while the previous release's daemon exited (it has no blackholes)", step, d, src, node)
						if node == src {
							prevExitLeak[src] += d
						}
					default:
						t.Errorf("%s: %d pod-to-pod frames from %s in the clear on %s's underlay (first ever: %s)", step, d, src, node, n.Sample)
					}
				}
				if n.WireGuard <= lastWire[node].WireGuard {
					t.Errorf("%s: no WireGuard frame on %s's underlay since the last step", step, node)
				}
				t.Logf("%s: %s underlay: %d WireGuard frames (+%d), %d pod frames in the clear (+%d)", step, node, n.WireGuard, n.WireGuard-lastWire[node].WireGuard, n.Cleartext, n.Cleartext-lastWire[node].Cleartext)
				lastWire[node] = n
			}
			for _, node := range c.Nodes {
				if err := c.wireGuardUserspace(node); err != nil {
					t.Errorf("%s: %v", step, err)
				}
			}
		}
		if len(r.Silent) > 0 {
			t.Errorf("%s: flows that never passed a packet: %v", step, r.Silent)
		}
		// Silences of this step over the limit are reported above; the
		// previous release's own stay out of the running maximum.
		if err := r.Problems(max(maxStreamGap, inheritedGap)); err != nil {
			t.Errorf("%s: %v", step, err)
		}
		t.Logf("%s: %d flows, longest silence %s, %d resets, %d denied probes through", step, r.Flows, r.MaxGap.Round(time.Millisecond), len(r.Resets), len(r.Through))
	}
	check("before the upgrade", "")
	if t.Failed() {
		t.FailNow()
	}

	baseline, err := c.SettledFootprints(ctx, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// The nodes' versions, and what each node held with each version with
	// the same pods: veths and endpoints must match the pods at every step;
	// map entry counts the first count seen with the same version (a
	// release may keep more or fewer entries per pod).
	version := map[string]string{}
	seen := map[string]Footprint{}
	for _, node := range c.Nodes {
		version[node] = previousTag
		seen[node+" "+previousTag] = baseline[node]
	}
	leaks := func(step string) {
		t.Helper()
		fps, err := c.SettledFootprints(ctx, 2*time.Minute)
		if err != nil {
			t.Errorf("%s: %v", step, err)
			return
		}
		for _, node := range c.Nodes {
			a := fps[node]
			if nb, na := baseline[node].CountLines("link ", "(veth)"), a.CountLines("link ", "(veth)"); nb != na {
				t.Errorf("%s: %s has %d veths, %d before the upgrade with the same pods", step, node, na, nb)
			}
			key := node + " " + version[node]
			if b, ok := seen[key]; ok {
				for _, prefix := range []string{"bpf map cdo_endpoints:", "bpf map cdo_ipcache:"} {
					if lb, la := b.Line(prefix), a.Line(prefix); lb != la {
						t.Errorf("%s: %s: %q, earlier with the same version and pods %q", step, node, la, lb)
					}
				}
			} else {
				seen[key] = a
				t.Logf("%s: %s with %s: %q %q", step, node, version[node], a.Line("bpf map cdo_endpoints:"), a.Line("bpf map cdo_ipcache:"))
			}
			if err := c.endpointsMatchPods(ctx, node); err != nil {
				t.Errorf("%s: %v", step, err)
			}
		}
	}

	// roll replaces the daemon on node with the image of tag and proves
	// a pod created there right after gets networking.
	var rollTimes []string
	roll := func(phase, node, tag string) {
		t.Helper()
		prevExit := ""
		if version[node] == previousTag {
			prevExit = node
		}
		began := time.Now()
		if err := c.replaceDaemon(ctx, node, tag); err != nil {
			t.Fatalf("%s %s: %v", phase, node, err)
		}
		took := time.Since(began)
		version[node] = tag
		for _, s := range []*pod{servers[0], servers[1]} {
			name := fmt.Sprintf("new-%s-%s-%s", phase, node, s.node)
			ok, err := c.Connect(ctx, ns, name, node, netip.AddrPortFrom(s.addr, uint16(tr.TCPPort)).String(), map[string]string{"role": "client"})
			if err != nil {
				t.Fatalf("%s %s: %v", phase, node, err)
			}
			if !ok {
				t.Errorf("%s %s: a pod created after the roll cannot reach %s", phase, node, s.name)
			}
		}
		// The probe pods gone (their DEL done) before the footprints.
		if err := testbed.WaitFor(ctx, "probe pods gone", time.Minute, func() error {
			l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			for _, p := range l.Items {
				if strings.HasPrefix(p.Name, "new-") {
					return fmt.Errorf("%s still there", p.Name)
				}
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		rollTimes = append(rollTimes, fmt.Sprintf("%s %s %s", phase, node, took.Round(100*time.Millisecond)))
		check(phase+" "+node, prevExit)
		leaks(phase + " " + node)
	}

	// Upgrade: the manifests of this tree (CRDs, RBAC, controller), then
	// each node's daemon.
	if _, err := c.Kubectl(ctx, "apply", "-k", curKz); err != nil {
		t.Fatal(err)
	}
	if err := c.rolloutStatus(ctx, "deployment/coordino-controller"); err != nil {
		t.Fatal(err)
	}
	check("upgrade controller", "")
	// The new leader rewrites what the previous release stored as
	// v1alpha1 (the IPPools at least) and says so in storedVersions.
	for _, plural := range []string{"ippools", "nodeconfigs", "identities", "policyirs", "nodeisolationpolicies"} {
		if err := testbed.WaitFor(ctx, plural+" storage version migrated", 2*time.Minute, func() error {
			out, err := c.Kubectl(ctx, "get", "crd", plural+".coordino.io", "-o", "jsonpath={.status.storedVersions}")
			if err != nil {
				return err
			}
			if strings.TrimSpace(out) != `["v1beta1"]` {
				return fmt.Errorf("storedVersions %s", out)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	for _, node := range []string{w1, w2} {
		roll("upgrade", node, currentTag)
	}
	// This tree's daemon replaced by itself: the next upgrade's step, and
	// under WireGuard the one where the device's own DaemonSet keeps the
	// tunnel up while the daemon's pod is gone.
	for _, node := range []string{w1, w2} {
		roll("restart", node, currentTag)
	}
	// Roll back: the previous pod templates (the CRDs and RBAC of this
	// tree stay; docs/operations.md), controller first, then each node.
	for _, obj := range []string{"deployment/coordino-controller", "daemonset/coordino"} {
		if _, err := c.Kubectl(ctx, "-n", "coordino-system", "rollout", "undo", obj); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.rolloutStatus(ctx, "deployment/coordino-controller"); err != nil {
		t.Fatal(err)
	}
	check("rollback controller", "")
	for _, node := range []string{w1, w2} {
		roll("rollback", node, previousTag)
	}
	after, err := c.SettledFootprints(ctx, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range c.Nodes {
		var kept, leaked []string
		diff := baseline[node].Diff(after[node])
		for _, l := range diff {
			switch {
			case keptForReupgrade(l):
				kept = append(kept, l)
			case l == "+ dir "+deleteQueueDir && !slices.ContainsFunc(diff, func(d string) bool { return strings.HasPrefix(d, "+ file "+deleteQueueDir+"/") }):
				// A DEL came while no daemon served on the node (the
				// kubelet removing an old sandbox during a replacement):
				// the plugin queued it, the next daemon applied it, and
				// the empty directory stays, as both releases leave it.
				t.Logf("%s: the DEL queue's directory, empty: a DEL was queued during a replacement and applied", node)
			default:
				leaked = append(leaked, l)
			}
		}
		if len(kept) > 0 {
			t.Logf("%s keeps what this tree's daemon pinned for a later upgrade:\n%s", node, strings.Join(kept, "\n"))
		}
		if len(leaked) > 0 {
			t.Errorf("%s after the upgrade and the roll back differs from before (leaked or lost):\n%s", node, strings.Join(leaked, "\n"))
		}
	}
	r := tr.Report()
	enc := "no encryption"
	if wg {
		var parts []string
		for node, n := range watch.Counts() {
			parts = append(parts, fmt.Sprintf("%s %d WireGuard frames, %d pod frames in the clear (%d sent at the previous release's exit)", node, n.WireGuard, n.Cleartext, prevExitLeak[node]))
		}
		sort.Strings(parts)
		enc = "WireGuard (userspace): " + strings.Join(parts, "; ")
		if prevEndsDevice {
			enc += fmt.Sprintf("; the previous release's device ending with its daemons' pods: silence up to %s", inheritedGap.Round(time.Millisecond))
		}
	}
	t.Logf("UPGRADE SUMMARY (%s): %d flows (TCP echo every 50 ms, UDP every 20 ms) over %s; resets %d; longest silence %s (%s); denied probes through %d; daemon replacements (delete to Ready): %s",
		enc, r.Flows, time.Since(start).Round(time.Second), len(r.Resets), r.MaxGap.Round(time.Millisecond), r.GapFlow, len(r.Through), strings.Join(rollTimes, ", "))
}

// deleteQueueDir is the DaemonSet's run dir's DEL queue, which the plugin
// creates on the first DEL it queues.
const deleteQueueDir = "/run/coordino/delete-queue"

// keptForReupgrade: what the newer daemon pins that the older one neither
// knows nor removes, by design: the schema stamp (the older release reads
// unstamped state as version 1 and leaves the stamp as the newer wrote
// it) and the newer programs (reused, not reloaded, when the node is
// upgraded again; docs/operations.md, Restart cost), and the maps the
// newer release added (the node ports it defers to the post-DNAT stage:
// unread by the older programs, replaced from the API by the newer
// daemon's first full view).
func keptForReupgrade(diffLine string) bool {
	return strings.HasPrefix(diffLine, "+ ") && (strings.Contains(diffLine, "/sys/fs/bpf/coordino/progs-") ||
		strings.HasSuffix(diffLine, "/sys/fs/bpf/coordino/cdo_schema") ||
		strings.HasSuffix(diffLine, "/sys/fs/bpf/coordino/cdo_svc_nodeports"))
}

// rolloutStatus waits for obj's rollout in coordino-system and, when it
// does not finish, says what its pods are doing.
func (c *Cluster) rolloutStatus(ctx context.Context, obj string) error {
	_, err := c.Kubectl(ctx, "-n", "coordino-system", "rollout", "status", "--timeout=3m", obj)
	if err == nil {
		return nil
	}
	pods, lerr := c.Client.CoreV1().Pods("coordino-system").List(ctx, metav1.ListOptions{})
	if lerr != nil {
		return fmt.Errorf("%w (pods: %v)", err, lerr)
	}
	return fmt.Errorf("%w; pods: %s", err, podProblems(pods.Items))
}

// pausePod starts an agnhost pause pod on node and returns its address.
func (c *Cluster) pausePod(ctx context.Context, ns, name, node string, labels map[string]string) (netip.Addr, error) {
	pod := c.agnhostPod(ns, name, node, labels, corev1.RestartPolicyAlways, "pause")
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return netip.Addr{}, err
	}
	var addr netip.Addr
	err := testbed.WaitFor(ctx, ns+"/"+name+" running", 3*time.Minute, func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			return fmt.Errorf("phase %s %s", p.Status.Phase, podWhy(p))
		}
		addr, err = netip.ParseAddr(p.Status.PodIP)
		return err
	})
	return addr, err
}

// waitDenied waits until three TCP connections in a row from ns to addr
// fail: the policy is in force.
func waitDenied(ctx context.Context, ns netns.NsHandle, addr netip.Addr, port int) error {
	row := 0
	return testbed.WaitFor(ctx, "policy in force", time.Minute, func() error {
		var ok bool
		_ = inNetns(ns, func() error {
			c, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr, uint16(port)).String(), 300*time.Millisecond)
			if err == nil {
				c.Close()
				ok = true
			}
			return nil
		})
		if ok {
			row = 0
			return fmt.Errorf("connected")
		}
		if row++; row < 3 {
			return fmt.Errorf("%d failures in a row", row)
		}
		return nil
	})
}

// replaceDaemon deletes the DaemonSet's pod on node and waits until its
// replacement, of the image with tag, is Ready.
func (c *Cluster) replaceDaemon(ctx context.Context, node, tag string) error {
	sel := metav1.ListOptions{LabelSelector: daemonSetSelector, FieldSelector: "spec.nodeName=" + node}
	pods, err := c.Client.CoreV1().Pods("coordino-system").List(ctx, sel)
	if err != nil {
		return err
	}
	old := map[string]bool{}
	for _, p := range pods.Items {
		old[string(p.UID)] = true
		if err := c.Client.CoreV1().Pods("coordino-system").Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			return err
		}
	}
	return testbed.WaitFor(ctx, "daemon on "+node+" replaced", 3*time.Minute, func() error {
		pods, err := c.Client.CoreV1().Pods("coordino-system").List(ctx, sel)
		if err != nil {
			return err
		}
		if len(pods.Items) != 1 {
			return fmt.Errorf("%d daemon pods on %s, want 1", len(pods.Items), node)
		}
		p := pods.Items[0]
		if old[string(p.UID)] {
			return fmt.Errorf("old pod %s still there", p.Name)
		}
		for _, ct := range p.Spec.Containers {
			if !strings.HasSuffix(ct.Image, ":"+tag) {
				return fmt.Errorf("pod %s runs %s, want tag %s", p.Name, ct.Image, tag)
			}
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("pod %s not Ready: %s", p.Name, podProblems([]corev1.Pod{p}))
	})
}

// endpointsMatchPods waits until node's NodeEndpoints lists exactly the
// addresses of its networked pods.
func (c *Cluster) endpointsMatchPods(ctx context.Context, node string) error {
	return testbed.WaitFor(ctx, node+" endpoints match its pods", time.Minute, func() error {
		pods, err := c.NodePodAddrs(ctx, node)
		if err != nil {
			return err
		}
		out, err := c.Kubectl(ctx, "get", "nodeendpoints", node, "-o", "jsonpath={.spec.endpoints[*].addresses[*]}")
		if err != nil {
			return err
		}
		got := strings.Fields(out)
		var want []string
		for a := range pods {
			want = append(want, a)
		}
		sort.Strings(got)
		sort.Strings(want)
		if d := diffSets(want, got); len(d) > 0 {
			return fmt.Errorf("%s: NodeEndpoints against pods (+ leaked, - missing): %v", node, d)
		}
		return nil
	})
}
