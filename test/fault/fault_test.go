package fault

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

const (
	podCIDR    = "10.97.0.0/24"
	bridgeCIDR = "10.98.0.0/24" // the chained network's primary (bridge + host-local)
	chainedPct = 30             // share of ADDs on the chained network
	reusePct   = 10             // share of ADDs that reuse a deleted container ID (a container restart)
	maxLive    = 20             // pods alive at once: bounds netns count and the final probes
	killPct    = 7              // share of operations during which the daemon is SIGKILLed
	maxDelay   = 40 * time.Millisecond
)

// denyAllIngress isolates every pod of namespace default for ingress.
const denyAllIngress = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all-ingress, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`

// network is one conflist on the node: Coordino as primary, or chained
// after the reference bridge plugin.
type network struct {
	name    string
	chained bool
	cni     *harness.CNI
}

// pod is an attachment the runtime believes exists (its ADD succeeded).
type pod struct {
	p      *harness.Pod
	rt     *libcni.RuntimeConf
	net    *network
	addr   netip.Addr
	hostIf string // where Coordino's programs sit
}

// gone is a deleted attachment whose container ID a restart may reuse.
type gone struct {
	id  string
	net *network
}

// run is the state of one randomized run, as a container runtime sees it.
type run struct {
	t *testing.T
	// nft: the daemon runs --datapath=nftables.
	nft    bool
	rng    *rand.Rand
	node   *harness.Node
	nets   []*network // primary, chained
	live   map[string]*pod
	gone   []gone   // recently deleted, for reuse
	order  []string // container IDs of live, in creation order (deterministic picks)
	client *pod     // never deleted: the source of the final probes
	trail  []string // the last operations, for the failure report
	seed   uint64
	kills  int
	// recoveryKills counts crashes during the daemon's start-up recovery.
	recoveryKills int
	// chainedAdds and restarts count ADDs on the chained network and ADDs
	// that reuse a deleted container ID.
	chainedAdds, restarts int
}

func envUint(name string, def uint64) uint64 {
	if v, err := strconv.ParseUint(os.Getenv(name), 10, 64); err == nil {
		return v
	}
	return def
}

// TestRandomFaults runs a seeded sequence of CNI operations with daemon
// crashes at random points, then checks that nothing leaked and every pod
// left is enforced.
func TestRandomFaults(t *testing.T) { runFaults(t, false, 1000) }

// TestRandomFaultsNFTables is the same on --datapath=nftables, 100
// operations by default (COORDINO_FAULT_OPS for more): the crash paths are
// the daemon's, what differs is the datapath adopting its table and
// records at each restart.
func TestRandomFaultsNFTables(t *testing.T) { runFaults(t, true, 100) }

func runFaults(t *testing.T, nft bool, defaultOps uint64) {
	privileged.Require(t)
	if err := harness.RequireBinaries(); err != nil {
		t.Fatal(err)
	}
	seed := envUint("COORDINO_FAULT_SEED", uint64(time.Now().UnixNano()))
	ops := int(envUint("COORDINO_FAULT_OPS", defaultOps))
	t.Logf("seed %d, %d operations (rerun: COORDINO_FAULT_SEED=%d go test -run '%s$' ./test/fault/)", seed, ops, seed, t.Name())

	dir := t.TempDir()
	policyDir, err := harness.NewPolicyDir(dir, "deny.yaml", denyAllIngress)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--policy-dir", policyDir, "--log-level", "info"}
	if nft {
		args = append(args, "--datapath=nftables")
	}
	node, err := harness.NewNode(dir, "fault-"+harness.RandomSuffix(6), harness.NodeOptions{PodCIDRs: []string{podCIDR}, ExtraArgs: args})
	if err != nil {
		t.Fatal(err)
	}
	r := &run{t: t, nft: nft, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), node: node, live: map[string]*pod{}, seed: seed}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("seed %d; last operations:\n%s\ndaemon log tail:\n%s", seed, strings.Join(r.trail, "\n"), node.LogTail(40))
		}
		for _, p := range r.live {
			p.p.Close()
		}
		node.Close()
	})
	if err := node.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	primary, err := node.NewCNI(node.PrimaryConflist("fault", "1.1.0"))
	if err != nil {
		t.Fatal(err)
	}
	chained, err := node.NewCNI([]byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"fault-chained","plugins":[
		{"type":"bridge","bridge":"cbrf%s","isGateway":true,"ipMasq":false,
		 "ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}},
		{"type":"coordino","runDir":%q}]}`, harness.RandomSuffix(4), bridgeCIDR, filepath.Join(dir, "host-local"), node.RunDir)))
	if err != nil {
		t.Fatal(err)
	}
	r.nets = []*network{{name: "fault", cni: primary}, {name: "fault-chained", chained: true, cni: chained}}
	start := time.Now()
	r.client = r.add(r.nets[0], "", false)
	if r.client == nil {
		t.Fatal("could not attach the probe client")
	}
	counts := map[string]int{}
	for i := range ops {
		op := r.pick()
		counts[op]++
		r.step(i, op)
		if t.Failed() {
			return
		}
	}
	t.Logf("%d operations (%v; %d ADDs chained, %d container restarts) with %d daemon kills (%d more during recovery) in %v; %d pods alive",
		ops, counts, r.chainedAdds, r.restarts, r.kills, r.recoveryKills, time.Since(start).Round(time.Millisecond), len(r.live))
	r.settle()
	r.assertNoLeaks()
	r.assertEnforced()
	// Tearing everything down leaves nothing either.
	for _, id := range slices.Clone(r.order) {
		r.del(id)
	}
	r.assertNoLeaks()
}

func (r *run) pick() string {
	n := len(r.live)
	switch {
	case n < 3:
		return "ADD"
	case n >= maxLive:
		return []string{"DEL", "DEL", "CHECK", "GC"}[r.rng.IntN(4)]
	}
	x := r.rng.IntN(100)
	switch {
	case x < 35:
		return "ADD"
	case x < 65:
		return "DEL"
	case x < 90:
		return "CHECK"
	}
	return "GC"
}

func (r *run) ctx() context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	r.t.Cleanup(cancel)
	return c
}

func (r *run) note(format string, args ...any) {
	r.trail = append(r.trail, fmt.Sprintf(format, args...))
	if len(r.trail) > 40 {
		r.trail = r.trail[1:]
	}
}

// step runs one operation, SIGKILLing and restarting the daemon during it
// when the dice say so. A failure is accepted only from an operation the
// crash overlapped, and then the runtime's follow-up must succeed.
func (r *run) step(i int, op string) {
	killed := r.rng.IntN(100) < killPct
	delay := time.Duration(r.rng.Int64N(int64(maxDelay)))
	var victim string
	if op != "ADD" && op != "GC" {
		victim = r.order[1+r.rng.IntN(len(r.order)-1)] // never the client
	}
	r.note("#%d %s %s kill=%v@%v", i, op, victim, killed, delay)
	var crash chan error
	if killed {
		r.kills++
		crash = make(chan error, 1)
		// Now and then recovery itself is interrupted too.
		restartDelay := time.Duration(-1)
		if r.rng.IntN(3) == 0 {
			restartDelay = time.Duration(r.rng.Int64N(int64(maxDelay)))
			r.recoveryKills++
			r.note("  and again %v into the restart", restartDelay)
		}
		go func() {
			time.Sleep(delay)
			if err := r.node.StopDaemon(syscall.SIGKILL); err != nil {
				crash <- err
				return
			}
			if restartDelay >= 0 {
				if err := r.node.CrashDuringStart(restartDelay); err != nil {
					crash <- err
					return
				}
			}
			crash <- r.node.StartDaemon()
		}()
	}
	waitCrash := func() {
		if crash != nil {
			if err := <-crash; err != nil {
				r.t.Fatalf("#%d: restarting the daemon: %v", i, err)
			}
			crash = nil
		}
	}
	defer waitCrash()

	switch op {
	case "ADD":
		net, id := r.nets[0], ""
		if r.rng.IntN(100) < chainedPct {
			net = r.nets[1]
		}
		if len(r.gone) > 0 && r.rng.IntN(100) < reusePct {
			g := r.gone[r.rng.IntN(len(r.gone))]
			net, id = g.net, g.id
			r.gone = slices.DeleteFunc(r.gone, func(x gone) bool { return x.id == g.id })
			r.note("  restart of %s on %s", id, net.name)
			r.restarts++
		}
		if net.chained {
			r.chainedAdds++
		}
		if p := r.add(net, id, killed); p == nil && !killed {
			r.t.Fatalf("#%d: ADD failed without a crash", i)
		}
	case "DEL":
		r.del(victim)
	case "CHECK":
		p := r.live[victim]
		err := p.net.cni.Check(r.ctx(), p.rt)
		if err != nil && !killed {
			r.t.Fatalf("#%d: CHECK %s without a crash: %v", i, victim, err)
		}
		if err != nil {
			waitCrash()
			if err := p.net.cni.Check(r.ctx(), p.rt); err != nil {
				r.t.Fatalf("#%d: CHECK %s after the daemon restarted: %v", i, victim, err)
			}
		}
	case "GC":
		net := r.nets[r.rng.IntN(len(r.nets))]
		err := net.cni.GC(r.ctx(), r.valid(net))
		if err != nil && !killed {
			r.t.Fatalf("#%d: GC without a crash: %v", i, err)
		}
		if err != nil {
			waitCrash()
			if err := net.cni.GC(r.ctx(), r.valid(net)); err != nil {
				r.t.Fatalf("#%d: GC after the daemon restarted: %v", i, err)
			}
		}
	}
}

// add attaches a new pod on net (with container ID id, or a fresh one); on
// failure it does what a runtime does, DEL, and returns nil.
func (r *run) add(net *network, id string, mayFail bool) *pod {
	p, err := harness.NewPod("p")
	if err != nil {
		r.t.Fatal(err)
	}
	rt := harness.RuntimeConf(p, "eth0")
	if id != "" {
		rt.ContainerID = id
	}
	res, err := net.cni.Add(r.ctx(), rt)
	if err != nil {
		r.note("  ADD %s failed: %v", rt.ContainerID, err)
		if !mayFail {
			r.t.Errorf("ADD %s: %v", rt.ContainerID, err)
		}
		if err := net.cni.Del(r.ctx(), rt); err != nil {
			r.t.Fatalf("DEL after a failed ADD of %s: %v", rt.ContainerID, err)
		}
		p.Close()
		r.gone = append(r.gone, gone{rt.ContainerID, net})
		return nil
	}
	addrs, err := harness.Addresses(res)
	if err != nil || len(addrs) != 1 {
		r.t.Fatalf("ADD %s result: %v %v", rt.ContainerID, addrs, err)
	}
	np := &pod{p: p, rt: rt, net: net, addr: addrs[0], hostIf: netsetup.HostIfName(net.name, rt.ContainerID, "eth0")}
	if net.chained {
		// The bridge's host-side veth: the result's interface outside any sandbox that is not the bridge.
		cur, err := current.NewResultFromResult(res)
		if err != nil {
			r.t.Fatal(err)
		}
		np.hostIf = ""
		for _, itf := range cur.Interfaces {
			if itf.Sandbox == "" && strings.HasPrefix(itf.Name, "veth") {
				np.hostIf = itf.Name
			}
		}
		if np.hostIf == "" {
			r.t.Fatalf("bridge result names no host veth: %s", harness.ResultJSON(res))
		}
	}
	r.live[rt.ContainerID] = np
	r.order = append(r.order, rt.ContainerID)
	return np
}

// del removes a pod; DEL must succeed whatever the daemon is doing (it is
// queued while the daemon is away).
func (r *run) del(id string) {
	p := r.live[id]
	if err := p.net.cni.Del(r.ctx(), p.rt); err != nil {
		r.t.Fatalf("DEL %s: %v", id, err)
	}
	p.p.Close()
	delete(r.live, id)
	if r.gone = append(r.gone, gone{id, p.net}); len(r.gone) > 10 {
		r.gone = r.gone[1:]
	}
	r.order = slices.DeleteFunc(r.order, func(s string) bool { return s == id })
}

// valid lists net's live attachments, as a runtime's GC does.
func (r *run) valid(net *network) []types.GCAttachment {
	var out []types.GCAttachment
	for _, id := range r.order {
		if r.live[id].net == net {
			out = append(out, types.GCAttachment{ContainerID: id, IfName: "eth0"})
		}
	}
	return out
}

// settle does what a node does in steady state: one more crash and restart
// (which applies queued DELs), then the runtime's periodic GC.
func (r *run) settle() {
	if err := r.node.StopDaemon(syscall.SIGKILL); err != nil {
		r.t.Fatal(err)
	}
	if err := r.node.StartDaemon(); err != nil {
		r.t.Fatal(err)
	}
	for _, net := range r.nets {
		if err := net.cni.GC(r.ctx(), r.valid(net)); err != nil {
			r.t.Fatalf("final GC of %s: %v", net.name, err)
		}
	}
}

// assertNoLeaks: exactly the live pods' veths, pins, addresses, records and
// BPF endpoints exist, and no DEL is left queued.
func (r *run) assertNoLeaks() {
	t := r.t
	var primaries, wantVeths, hostIfs []string
	for id, p := range r.live {
		hostIfs = append(hostIfs, p.hostIf)
		if !p.net.chained {
			primaries = append(primaries, id)
			wantVeths = append(wantVeths, p.hostIf)
		}
	}
	if err := r.node.Leaks(len(primaries)); err != nil {
		t.Fatalf("leak: %v", err)
	}
	if n, err := r.node.Metric("coordino_endpoints", `mode="chained"`); err != nil || int(n) != len(r.live)-len(primaries) {
		t.Fatalf("%v chained records (%v), want %d", n, err, len(r.live)-len(primaries))
	}
	veths, err := r.node.HostVeths()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(wantVeths)
	slices.Sort(veths)
	if !slices.Equal(veths, wantVeths) {
		t.Fatalf("host veths %v, want those of the live primary pods %v", veths, wantVeths)
	}
	var wantIdx []int
	if err := r.node.NS.Do(func(ns.NetNS) error {
		for _, name := range hostIfs {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			wantIdx = append(wantIdx, l.Attrs().Index)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(wantIdx)
	if r.nft {
		// A DEL leaves its endpoint's entries, behind a drop, to the
		// datapath's sweep once the table is quiet (300 ms).
		slices.Sort(hostIfs)
		var ifnames []string
		var records int
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			ifnames, records, err = r.node.NFTablesEndpoints()
			if err != nil {
				t.Fatal(err)
			}
			if slices.Equal(ifnames, hostIfs) && records == len(r.live) || time.Now().After(deadline) {
				break
			}
		}
		if !slices.Equal(ifnames, hostIfs) || records != len(r.live) {
			t.Fatalf("nftables endpoints on %v with %d records, want %v and %d", ifnames, records, hostIfs, len(r.live))
		}
	} else {
		idx, records, err := r.node.DatapathEndpoints()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(idx, wantIdx) || records != len(r.live) {
			t.Fatalf("BPF endpoints on ifindexes %v with %d state records, want %v and %d", idx, records, wantIdx, len(r.live))
		}
	}
	if queued, _ := filepath.Glob(filepath.Join(r.node.RunDir, "delete-queue", "*")); len(queued) != 0 {
		t.Fatalf("DELs still queued: %v", queued)
	}
}

// assertEnforced: every live pod has its programs attached (nftables: its
// chains, which assertNoLeaks checked) and its default-deny ingress holds:
// a probe from the client pod is dropped, while the node (always allowed)
// reaches the same port and is refused by the pod. The nftables datapath
// does not see traffic to a bridge port (docs/architecture.md), so there
// the chained pods get the node's probe only.
func (r *run) assertEnforced() {
	t := r.t
	var probes []harness.Probe
	var targets []string
	for _, id := range r.order {
		p := r.live[id]
		if !r.nft {
			in, eg, err := r.node.BPFFilters(p.hostIf)
			if err != nil || in < 1 || eg < 1 {
				t.Fatalf("pod %s: BPF filters on %s ingress=%d egress=%d (%v)", id, p.hostIf, in, eg, err)
			}
		}
		probes = append(probes, harness.Probe{From: r.node.NS, To: p.addr, Port: 9, Proto: "tcp"})
		targets = append(targets, "node→"+id)
		if p != r.client && !(r.nft && p.net.chained) {
			probes = append(probes, harness.Probe{From: r.client.p.NS, To: p.addr, Port: 9, Proto: "tcp"})
			targets = append(targets, "client→"+id)
		}
	}
	out, err := harness.ProbeAll(probes, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		want := harness.Blocked
		if strings.HasPrefix(targets[i], "node→") {
			want = harness.Refused
		}
		if o != want {
			t.Errorf("%s: %v, want %v", targets[i], o, want)
		}
	}
}
