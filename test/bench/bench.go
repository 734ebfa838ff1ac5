package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/coordino/coordino/test/harness"
)

// Params shape one benchmark run.
type Params struct {
	// N is the number of measured pods per system in each mode.
	N int `json:"n"`
	// Concurrency is the number of parallel workers in the concurrent mode.
	Concurrency int `json:"concurrency"`
	// Rounds splits the N pods of a mode into rounds; each round runs every
	// system once, in an order rotated per round.
	Rounds int `json:"rounds"`
	// Warmup is the number of unmeasured ADD+DEL pairs per system first.
	Warmup int `json:"warmup"`
	// DaemonArgs are extra coordino-daemon flags (e.g. --legacy-tc), to
	// compare daemon configurations.
	DaemonArgs []string `json:"daemon_args,omitempty"`
	// BaselineDaemon, when set, is another coordino-daemon build measured in
	// the same rounds (A/B): two more systems, primary and chained.
	BaselineDaemon string `json:"baseline_daemon,omitempty"`
	// Progress receives one line per round; nil discards them.
	Progress io.Writer `json:"-"`
}

// DefaultParams are the parameters of `make bench`.
func DefaultParams() Params { return Params{N: 200, Concurrency: 16, Rounds: 10, Warmup: 10} }

// QuickParams are a short run: enough samples for every row, in seconds.
func QuickParams() Params { return Params{N: 16, Concurrency: 4, Rounds: 2, Warmup: 2} }

func (p Params) validate() error {
	if p.N < 1 || p.Concurrency < 1 || p.Rounds < 1 || p.Warmup < 0 {
		return fmt.Errorf("need n, concurrency, rounds >= 1 and warmup >= 0, got %+v", p)
	}
	return nil
}

// System names, as they appear in the report.
const (
	SysCoordino = "coordino"
	SysRef      = "bridge+host-local"
	SysChained  = "bridge+host-local,coordino"
	// SysChainedNoop chains a Go plugin that only passes prevResult on
	// (test/bench/chainnoop): the cost of a second plugin process alone.
	SysChainedNoop = "bridge+host-local,chainnoop"
)

// Verbs measured.
const (
	VerbAdd = "ADD"
	VerbDel = "DEL"
)

// Address ranges of the systems: disjoint, and only inside their node netns.
const (
	coordinoCIDR = "10.90.0.0/16"
	refCIDR      = "10.91.0.0/16"
	chainedCIDR  = "10.92.0.0/16"
	noopCIDR     = "10.93.0.0/16"
)

// opTimeout bounds one CNI call; far above any sane latency, it only keeps
// a wedged plugin from hanging the run.
const opTimeout = 60 * time.Second

// mode is one way of driving the systems.
type mode struct {
	Name string
	// Workers run in parallel; each handles PerWorker pods per round.
	Workers, PerWorker int
}

func (p Params) modes() []mode {
	perRound := ceilDiv(p.N, p.Rounds)
	return []mode{
		{Name: "sequential", Workers: 1, PerWorker: perRound},
		{Name: fmt.Sprintf("concurrent-%d", p.Concurrency), Workers: p.Concurrency, PerWorker: ceilDiv(perRound, p.Concurrency)},
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// system is one CNI configuration on its own node.
type system struct {
	name string
	node *harness.Node
	cni  *harness.CNI
	// daemon marks systems whose node runs coordino-daemon, for the
	// server-side breakdown.
	daemon bool

	mu  sync.Mutex
	err error // first failure; the system is skipped from then on
}

func (s *system) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

func (s *system) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// slot is a pod netns, the attachment currently made in it and what has
// been done to that, so cleanup knows whether it still owes a DEL.
type slot struct {
	sys     *system
	pod     *harness.Pod
	rt      *libcni.RuntimeConf
	tried   bool // ADD was attempted: DEL is owed even if ADD failed
	added   bool // ADD succeeded: its DEL latency is a real sample
	deleted bool
}

// bed owns everything the run creates, so that one Close removes it all.
type bed struct {
	dir      string
	nodes    []*harness.Node
	systems  []*system
	progress io.Writer

	mu   sync.Mutex
	live map[*slot]bool
	// modeOf maps a measured pod's container ID to its mode, to sort the
	// daemon's own timings.
	modeOf         map[string]string
	res            *samples
	daemonArgs     []string
	baselineDaemon string
	// binaries fingerprints bin/ when the run starts.
	binaries map[string]string
	// empty is the empty Go binary; emptyCPU is what emptyN execs of it cost.
	empty    string
	emptyCPU time.Duration
	emptyN   int
	// execCost is the plugin process alone against a stub daemon.
	execCost *ExecCost
}

// Run sets up the nodes, runs every mode, and tears everything down. On
// cancellation it stops after the calls in flight and returns ctx's error.
func Run(ctx context.Context, p Params) (*Report, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the benchmark needs root: it creates network namespaces")
	}
	if err := harness.RequireBinaries(); err != nil {
		return nil, err
	}
	b := &bed{progress: p.Progress, live: map[*slot]bool{}, modeOf: map[string]string{}, res: newSamples(),
		daemonArgs: p.DaemonArgs, baselineDaemon: p.BaselineDaemon}
	b.binaries = b.fingerprint()
	if b.progress == nil {
		b.progress = io.Discard
	}
	defer b.Close()
	if err := b.setup(); err != nil {
		return nil, err
	}
	start := time.Now()
	for _, s := range b.systems {
		if s.failed() == nil {
			b.warmup(ctx, s, p.Warmup)
		}
	}
	modes := p.modes()
	for _, m := range modes {
		if err := b.runMode(ctx, m, p.Rounds, start); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return b.report(p, modes, time.Since(start)), nil
}

// setup creates the three nodes; a chained node that fails to start is
// recorded as that system's error, not the run's.
func (b *bed) setup() error {
	dir, err := os.MkdirTemp("", "coordino-bench-")
	if err != nil {
		return err
	}
	b.dir = dir
	if b.empty, err = buildEmpty(dir); err != nil {
		return err
	}
	if b.execCost, err = measureExecCost(dir, b.empty, 100); err != nil {
		return fmt.Errorf("plugin exec cost: %w", err)
	}
	newNodeWith := func(name string, cidrs []string, opts harness.NodeOptions) (*harness.Node, error) {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
		opts.PodCIDRs = cidrs
		n, err := harness.NewNode(d, "bench-"+name, opts)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
		b.nodes = append(b.nodes, n)
		return n, nil
	}
	newNode := func(name string, cidrs []string, extra []string) (*harness.Node, error) {
		return newNodeWith(name, cidrs, harness.NodeOptions{ExtraArgs: extra})
	}

	cn, err := newNode("coordino", []string{coordinoCIDR}, b.daemonArgs)
	if err != nil {
		return err
	}
	if err := cn.StartDaemon(); err != nil {
		return fmt.Errorf("coordino node: %w", err)
	}
	coordino := &system{name: SysCoordino, node: cn, daemon: true}
	if coordino.cni, err = cn.NewCNI(cn.PrimaryConflist("coordino", "1.1.0")); err != nil {
		return err
	}

	rn, err := newNode("ref", nil, nil)
	if err != nil {
		return err
	}
	ref := &system{name: SysRef, node: rn}
	if ref.cni, err = rn.NewCNI(bridgeConflist("bench-ref", refCIDR, rn)); err != nil {
		return err
	}
	noop, err := b.newChainedNoop(dir, newNodeWith)
	if err != nil {
		return err
	}

	chained, err := newChained(SysChained, "chained", chainedCIDR, harness.NodeOptions{ExtraArgs: b.daemonArgs}, newNodeWith)
	if err != nil {
		return err
	}
	b.systems = []*system{coordino, ref, chained, noop}
	if b.baselineDaemon != "" {
		return b.setupBaseline(b.baselineDaemon, newNodeWith)
	}
	return nil
}

// nodeMaker creates a node of the run.
type nodeMaker func(name string, cidrs []string, opts harness.NodeOptions) (*harness.Node, error)

// newChained is a chained system on its own chained-only node (no pod CIDR:
// Coordino allocates nothing there): the bridge conflist with Coordino
// after it, its addresses from cidr. A daemon that fails to start is the
// system's error, not the run's.
func newChained(sysName, nodeName, cidr string, opts harness.NodeOptions, newNode nodeMaker) (*system, error) {
	n, err := newNode(nodeName, nil, opts)
	if err != nil {
		return nil, err
	}
	s := &system{name: sysName, node: n, daemon: true}
	if s.cni, err = n.NewCNI(bridgeConflist("bench-chained", cidr, n, map[string]any{"type": "coordino", "runDir": n.RunDir})); err != nil {
		return nil, err
	}
	if err := n.StartDaemon(); err != nil {
		s.fail(fmt.Errorf("start daemon on node %s: %w", nodeName, err))
	}
	return s, nil
}

// newChainedNoop is the reference primary followed by chainnoop, on its own
// node without a daemon.
func (b *bed) newChainedNoop(dir string, newNode nodeMaker) (*system, error) {
	bin, err := buildCommand(dir, "chainnoop")
	if err != nil {
		return nil, err
	}
	n, err := newNode("noop", nil, harness.NodeOptions{})
	if err != nil {
		return nil, err
	}
	s := &system{name: SysChainedNoop, node: n}
	s.cni, err = n.NewCNI(bridgeConflist("bench-noop", noopCIDR, n, map[string]any{"type": "chainnoop"}),
		harness.BinDir(), harness.RefBinDir(), filepath.Dir(bin))
	return s, err
}

// bridgeConflist is the reference primary: the bridge plugin with
// host-local IPAM (state kept in the node's scratch dir, not
// /var/lib/cni), followed by the chained plugins after, if any.
func bridgeConflist(name, subnet string, n *harness.Node, after ...map[string]any) []byte {
	plugins := []any{map[string]any{
		"type": "bridge", "bridge": "cbr0", "isGateway": true, "ipMasq": false,
		"ipam": map[string]any{
			"type":    "host-local",
			"ranges":  [][]map[string]string{{{"subnet": subnet}}},
			"dataDir": filepath.Join(n.Dir, "host-local"),
		},
	}}
	for _, p := range after {
		plugins = append(plugins, p)
	}
	out, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": name, "plugins": plugins})
	return out
}

// warmup runs unmeasured ADD+DEL pairs so page cache, the daemon's first
// allocations and the kernel's first veth/bridge setup are out of the way.
func (b *bed) warmup(ctx context.Context, s *system, n int) {
	sl, err := b.newSlot(s, "warm-up")
	if err != nil {
		s.fail(fmt.Errorf("warm-up pod: %w", err))
		return
	}
	defer b.release(sl)
	for i := 0; i < n && ctx.Err() == nil && s.failed() == nil; i++ {
		sl.renew()
		if _, err := b.add(sl); err != nil {
			s.fail(fmt.Errorf("warm-up ADD: %w", err))
		}
		if _, err := b.del(sl); err != nil {
			s.fail(fmt.Errorf("warm-up DEL: %w", err))
		}
	}
}

// runMode gives every system one pool of pod netns for the whole mode,
// created before anything is timed and reused round after round under a
// fresh container ID (DEL leaves a pod netns as empty as a new one).
// Creating and destroying namespaces between rounds would not be timed, but
// the kernel tears namespaces down asynchronously under the RTNL lock, and
// that work would bleed into the next round's measurements.
func (b *bed) runMode(ctx context.Context, m mode, rounds int, start time.Time) error {
	pools := map[*system][]*slot{}
	defer func() {
		for _, pool := range pools {
			for _, sl := range pool {
				b.release(sl)
			}
		}
	}()
	for _, s := range b.systems {
		for i := 0; i < m.Workers*m.PerWorker && s.failed() == nil; i++ {
			sl, err := b.newSlot(s, fmt.Sprintf("%s-%d", m.Name, i))
			if err != nil {
				return fmt.Errorf("create pod netns: %w", err)
			}
			pools[s] = append(pools[s], sl)
		}
	}
	settle(ctx)
	for r := 0; r < rounds; r++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		for i := range b.systems {
			s := b.systems[(i+r)%len(b.systems)]
			if s.failed() != nil {
				continue
			}
			b.mu.Lock()
			for _, sl := range pools[s] {
				sl.renew()
				b.modeOf[sl.rt.ContainerID] = m.Name
			}
			b.mu.Unlock()
			b.phase(ctx, m, s, pools[s], VerbAdd)
			// DEL runs even after a cancel or a failed ADD: it is what cleans up.
			b.phase(context.Background(), m, s, pools[s], VerbDel)
		}
		if m.Workers == 1 {
			// The floor for one plugin exec, measured alongside the systems.
			if err := b.execEmpty(m.PerWorker); err != nil {
				return err
			}
		}
		fmt.Fprintf(b.progress, "%s round %d/%d done (%s)\n", m.Name, r+1, rounds, time.Since(start).Round(time.Second))
	}
	return nil
}

// settle waits for the kernel to finish destroying the namespaces the
// previous step dropped (see runMode) before timing resumes.
func settle(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
	}
}

// phase runs one verb over pool with m.Workers workers, each owning a
// contiguous share of the pool, started together.
func (b *bed) phase(ctx context.Context, m mode, s *system, pool []*slot, verb string) {
	var ops atomic.Int64
	before := readCPU(s.node.DaemonPID())
	defer func() {
		b.res.addCPU(m.Name, verb, s.name, readCPU(s.node.DaemonPID()).sub(before), int(ops.Load()))
	}()
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	for w := 0; w < m.Workers; w++ {
		lo, hi := w*m.PerWorker, min((w+1)*m.PerWorker, len(pool))
		if lo >= hi {
			break
		}
		wg.Add(1)
		go func(share []*slot) {
			defer wg.Done()
			<-startGate
			for _, sl := range share {
				if ctx.Err() != nil {
					return
				}
				if b.measure(m, sl, verb) {
					ops.Add(1)
				}
			}
		}(pool[lo:hi])
	}
	close(startGate)
	wg.Wait()
}

// measure runs verb on one slot and records its latency if it counts. It
// reports whether it ran the verb at all.
func (b *bed) measure(m mode, sl *slot, verb string) bool {
	s := sl.sys
	switch verb {
	case VerbAdd:
		if s.failed() != nil {
			return false
		}
		took, err := b.add(sl)
		if err != nil {
			s.fail(fmt.Errorf("%s ADD of pod %s: %w", m.Name, sl.pod.Name, err))
			b.res.fail(m.Name, verb, s.name)
			return true
		}
		b.res.add(m.Name, verb, s.name, took)
	case VerbDel:
		if !sl.tried || sl.deleted {
			return false
		}
		counted := sl.added
		took, err := b.del(sl)
		if err != nil {
			s.fail(fmt.Errorf("%s DEL of pod %s: %w", m.Name, sl.pod.Name, err))
			b.res.fail(m.Name, verb, s.name)
			return true
		}
		if counted {
			b.res.add(m.Name, verb, s.name, took)
		}
	}
	return true
}

func (b *bed) newSlot(s *system, name string) (*slot, error) {
	pod, err := harness.NewPod(name)
	if err != nil {
		return nil, err
	}
	sl := &slot{sys: s, pod: pod}
	sl.renew()
	b.mu.Lock()
	b.live[sl] = true
	b.mu.Unlock()
	return sl, nil
}

// renew makes the slot a new sandbox in the same netns: a fresh container ID,
// so neither libcni's cache nor a daemon record of the last one applies.
func (sl *slot) renew() {
	sl.rt = harness.RuntimeConf(sl.pod, "eth0")
	sl.rt.ContainerID = "c" + harness.RandomSuffix(31)
	sl.tried, sl.added, sl.deleted = false, false, false
}

// add times one ADD: the libcni call from inside the node netns, exactly
// what a runtime waits for (plugin execs, daemon work, result cache write).
func (b *bed) add(sl *slot) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	sl.tried = true
	start := time.Now()
	_, err := sl.sys.cni.Add(ctx, sl.rt)
	took := time.Since(start)
	sl.added = err == nil
	return took, err
}

func (b *bed) del(sl *slot) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	start := time.Now()
	err := sl.sys.cni.Del(ctx, sl.rt)
	took := time.Since(start)
	sl.deleted = err == nil
	return took, err
}

// release DELs the slot if still owed (best effort) and removes its netns.
func (b *bed) release(sl *slot) {
	if sl.tried && !sl.deleted {
		_, _ = b.del(sl)
	}
	sl.pod.Close()
	b.mu.Lock()
	delete(b.live, sl)
	b.mu.Unlock()
}

// Close undoes everything: owed DELs, pod netns, daemons (by PID, through
// the harness), node netns with their bridges, pins and BPF dirs, scratch.
func (b *bed) Close() {
	b.mu.Lock()
	var left []*slot
	for sl := range b.live {
		left = append(left, sl)
	}
	b.mu.Unlock()
	for _, sl := range left {
		b.release(sl)
	}
	for _, n := range b.nodes {
		n.Close()
	}
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}
