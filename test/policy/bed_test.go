package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// mode is one way of running Coordino.
type mode struct {
	name    string
	tcx     bool   // --attach-mode=tcx instead of the default clsact + cls_bpf
	nft     bool   // --datapath=nftables: no BPF, the inet coordino-policy table
	chained bool   // [bridge + host-local, coordino] instead of Coordino as primary
	subnet  string // pod CIDR (primary) or the bridge's host-local range (chained)
	subnet6 string // IPv6 pod CIDR next to subnet: dual-stack pods (primary only)
	k8s     bool   // Kubernetes mode: policies through the API (kubernetes_test.go); subnet is the NodeConfig block
}

var (
	primaryTC  = mode{name: "primary-tc", subnet: "10.181.0.0/24"}
	primaryTCX = mode{name: "primary-tcx", tcx: true, subnet: "10.182.0.0/24"}
	chained    = mode{name: "chained-bridge", chained: true, subnet: "10.183.0.0/24"}
	primaryNFT = mode{name: "primary-nftables", nft: true, subnet: "10.184.0.0/24"}
)

// bed is one node with the nine matrix pods.
type bed struct {
	t         *testing.T
	mode      mode
	node      *harness.Node
	policyDir string
	cidr      netip.Prefix
	cidr6     netip.Prefix // valid in dual-stack mode only
	bridge    string
	pods      map[peer]*bedPod
	api       *bedAPI // Kubernetes mode only
}

type bedPod struct {
	peer
	pod    *harness.Pod
	ip     netip.Addr
	ip6    netip.Addr // the pod's IPv6 address in dual-stack mode
	hostIf string
	rt     *libcni.RuntimeConf
	cni    *harness.CNI
}

// namespaceYAML labels the three namespaces ns=<name>; the daemon adds
// kubernetes.io/metadata.name itself.
func namespaceYAML() string {
	var b strings.Builder
	for _, ns := range namespaces {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: %q\n  labels:\n    ns: %q\n", ns, ns)
	}
	return b.String()
}

// policyFile is the file every case rewrites; namespaces live in their own.
const policyFile = "policies.yaml"

// newBed starts a daemon for m and attaches the nine pods, each serving
// TCP and UDP on ports 80 and 81.
func newBed(t *testing.T, m mode) *bed {
	t.Helper()
	privileged.Require(t)
	if err := harness.RequireBinaries(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	b := &bed{t: t, mode: m, policyDir: filepath.Join(dir, "policies"), cidr: netip.MustParsePrefix(m.subnet),
		bridge: "cpb" + harness.RandomSuffix(8), pods: map[peer]*bedPod{}}
	if err := os.MkdirAll(b.policyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.policyDir, "00-namespaces.yaml"), []byte(namespaceYAML()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.policyDir, policyFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	opts := harness.NodeOptions{ExtraArgs: []string{"--policy-dir", b.policyDir}}
	if m.k8s {
		opts = harness.NodeOptions{}
	}
	if !m.chained && !m.k8s {
		opts.PodCIDRs = []string{m.subnet}
		if m.subnet6 != "" {
			b.cidr6 = netip.MustParsePrefix(m.subnet6)
			opts.PodCIDRs = append(opts.PodCIDRs, m.subnet6)
		}
	}
	if m.tcx {
		opts.ExtraArgs = append(opts.ExtraArgs, "--attach-mode=tcx")
	}
	if m.nft {
		opts.ExtraArgs = append(opts.ExtraArgs, "--datapath=nftables")
	}
	n, err := harness.NewNode(filepath.Join(dir, "node"), "node-"+harness.RandomSuffix(6), opts)
	if err != nil {
		t.Fatal(err)
	}
	b.node = n
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log tail:\n%s", n.LogTail(40))
		}
		n.Close()
	})
	if m.k8s {
		b.api = startAPI(t, n, m.subnet)
	}
	if err := n.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		bp := b.addPod(p, map[string]string{"pod": p.pod})
		b.serve(bp)
	}
	return b
}

func (b *bed) pod(p peer) *bedPod {
	bp, ok := b.pods[p]
	if !ok {
		b.t.Fatalf("no pod %s", p)
	}
	return bp
}

// conflist is the network config for one pod: labels live in it.
func (b *bed) conflist(labels map[string]string) []byte {
	t := b.t
	var base []byte
	if b.mode.chained {
		var err error
		base, err = json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "policy-chained", "plugins": []map[string]any{
			{"type": "bridge", "bridge": b.bridge, "isGateway": true, "ipMasq": false, "ipam": map[string]any{
				"type": "host-local", "ranges": [][]map[string]any{{{"subnet": b.mode.subnet}}},
				"dataDir": filepath.Join(b.node.Dir, "host-local")}},
			{"type": "coordino", "runDir": b.node.RunDir},
		}})
		if err != nil {
			t.Fatal(err)
		}
	} else {
		base = b.node.PrimaryConflist("policy-primary", "1.1.0")
	}
	out, err := harness.WithPodLabels(base, labels)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (b *bed) ctx() context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	b.t.Cleanup(cancel)
	return c
}

// addPod creates a netns and runs ADD for it; DEL runs at cleanup. The pod
// is registered under p for the matrix.
func (b *bed) addPod(p peer, labels map[string]string) *bedPod {
	bp := b.newPod(p)
	b.attach(bp, labels)
	return bp
}

// newPod creates the pod's netns without attaching it.
func (b *bed) newPod(p peer) *bedPod {
	t := b.t
	hp, err := harness.NewPod(p.ns + "-" + p.pod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hp.Close)
	bp := &bedPod{peer: p, pod: hp, rt: harness.RuntimeConfIn(hp, "eth0", p.ns)}
	b.pods[p] = bp
	return bp
}

// attach runs ADD for a pod made by newPod.
func (b *bed) attach(bp *bedPod, labels map[string]string) {
	t := b.t
	if b.api != nil {
		b.api.pod(bp, labels)
	}
	c, err := b.node.NewCNI(b.conflist(labels))
	if err != nil {
		t.Fatal(err)
	}
	bp.cni = c
	res, err := c.Add(b.ctx(), bp.rt)
	if err != nil {
		t.Fatalf("ADD %s: %v", bp.peer, err)
	}
	t.Cleanup(func() {
		if err := c.Del(context.Background(), bp.rt); err != nil {
			t.Errorf("DEL %s: %v", bp.peer, err)
		}
	})
	addrs, err := harness.Addresses(res)
	if b.cidr6.IsValid() {
		// Dual-stack: exactly one address per family, each from its own CIDR.
		if err != nil || len(addrs) != 2 || !b.cidr.Contains(addrs[0]) || !b.cidr6.Contains(addrs[1]) {
			t.Fatalf("ADD %s: addresses %v (%v), want one in %v and one in %v", bp.peer, addrs, err, b.cidr, b.cidr6)
		}
		bp.ip6 = addrs[1]
	} else if err != nil || len(addrs) != 1 || !b.cidr.Contains(addrs[0]) {
		t.Fatalf("ADD %s: addresses %v (%v), want one in %v", bp.peer, addrs, err, b.cidr)
	}
	bp.ip = addrs[0]
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range cur.Interfaces {
		if i.Sandbox == "" && i.Name != b.bridge {
			bp.hostIf = i.Name
		}
	}
	if bp.hostIf == "" {
		t.Fatalf("ADD %s: no host-side interface in %s", bp.peer, harness.ResultJSON(res))
	}
}

// serve starts TCP and UDP servers on ports 80 and 81 on the pod's
// address, and on its IPv6 address in dual-stack mode.
func (b *bed) serve(bp *bedPod) {
	b.serveOn(bp, bp.ip)
	if bp.ip6.IsValid() {
		b.serveOn(bp, bp.ip6)
	}
}

func (b *bed) serveOn(bp *bedPod, ip netip.Addr) {
	t := b.t
	for _, s := range services {
		var stop func()
		var err error
		if s.proto == "tcp" {
			stop, err = harness.Serve(bp.pod.NS, ip, s.port, bp.peer.String())
		} else {
			stop, err = harness.ServeUDPEcho(bp.pod.NS, ip, s.port)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
}

// apply replaces the policy file with docs and waits until the daemon has
// loaded it, checking that every file and policy was accepted.
func (b *bed) apply(docs string) error {
	if b.api != nil {
		return b.api.apply(b.t, docs)
	}
	if err := b.node.WritePolicy(b.policyDir, policyFile, []byte(docs), 5*time.Second); err != nil {
		return err
	}
	for _, m := range []string{"coordino_policy_files_invalid", "coordino_policy_invalid"} {
		v, err := b.node.Metric(m)
		if err != nil {
			return err
		}
		if v != 0 {
			return fmt.Errorf("%s = %v after loading:\n%s\nlog:\n%s", m, v, docs, b.node.LogTail(10))
		}
	}
	return nil
}

// checkAttachMode asserts the programs on every host interface use the
// mode's attach method: tcx links, cls_bpf filters on clsact, or none
// (nftables).
func (b *bed) checkAttachMode() {
	t := b.t
	for _, p := range pods {
		bp := b.pod(p)
		in, out, err := b.node.TCXPrograms(bp.hostIf)
		if err != nil {
			t.Fatal(err)
		}
		fin, fout, err := b.node.BPFFilters(bp.hostIf)
		if err != nil {
			t.Fatal(err)
		}
		filters := fin + fout
		want := [3]int{0, 0, 2}
		switch {
		case b.mode.tcx:
			want = [3]int{1, 1, 0}
		case b.mode.nft:
			want = [3]int{0, 0, 0}
		}
		if got := [3]int{in, out, filters}; got != want {
			t.Fatalf("%s (%s): tcx ingress/egress programs and cls_bpf filters = %v, want %v", p, bp.hostIf, got, want)
		}
	}
}
