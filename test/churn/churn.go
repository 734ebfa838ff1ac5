package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/coordino/coordino/test/harness"
)

// Params shape one churn run.
type Params struct {
	Duration time.Duration `json:"duration"`
	// Rate is pods started per minute; each is deleted after its lifetime.
	Rate int `json:"pods_per_minute"`
	// Lifetime is the mean time between a pod's ADD and its DEL.
	Lifetime time.Duration `json:"lifetime"`
	// FreshLabels is the share of pods with a label set never seen before;
	// the rest draw from a few repeated sets.
	FreshLabels float64 `json:"fresh_labels"`
	// SampleEvery is the daemon CPU/RSS sampling period.
	SampleEvery time.Duration `json:"sample_every"`
	Progress    io.Writer     `json:"-"`
}

// DefaultParams are `make bench-churn`: 500 pods/min for 10 minutes.
func DefaultParams() Params {
	return Params{Duration: 10 * time.Minute, Rate: 500, Lifetime: 6 * time.Second, FreshLabels: 0.3, SampleEvery: 10 * time.Second}
}

const (
	podCIDR    = "10.94.0.0/16"
	serverPort = 8080
	network    = "coordino"
	opTimeout  = 60 * time.Second
)

// repeatedLabels are the label sets most pods share; the policies select them.
var repeatedLabels = []map[string]string{
	{"app": "web", "tier": "frontend"}, {"app": "api", "tier": "backend"}, {"app": "db", "tier": "data"},
	{"app": "cache", "tier": "data"}, {"app": "batch"}, {"app": "web", "tier": "canary"},
}

// policies isolate the server (ingress from every pod of the namespace) and
// the data tier (ingress only from the backend), so policy is computed for
// every new identity.
const policies = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-namespace, namespace: default}
spec:
  podSelector: {matchLabels: {role: server}}
  policyTypes: [Ingress]
  ingress: [{from: [{podSelector: {}}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: data-from-backend, namespace: default}
spec:
  podSelector: {matchLabels: {tier: data}}
  policyTypes: [Ingress, Egress]
  ingress: [{from: [{podSelector: {matchLabels: {tier: backend}}}]}]
  egress: [{to: [{podSelector: {matchLabels: {role: server}}}]}]
`

// Sample is one reading of the daemon.
type Sample struct {
	At     float64 `json:"t_s"`
	CPUPct float64 `json:"cpu_pct"` // over the last period, of one core
	RSSMB  float64 `json:"rss_mb"`
	Live   int     `json:"live_pods"`
}

// Report is the outcome of one run.
type Report struct {
	Date    string        `json:"date"`
	Params  Params        `json:"params"`
	LoadAvg string        `json:"loadavg"`
	Pods    int           `json:"pods"`
	Add     harness.Stats `json:"add"`
	Del     harness.Stats `json:"del"`
	// Errors counts failed ADDs, DELs and connections; Failures holds the first few.
	Errors   int      `json:"errors"`
	Failures []string `json:"failures,omitempty"`
	Samples  []Sample `json:"samples"`
	// Slopes are least-squares fits, per minute, over the samples taken
	// between ramp-up (two lifetimes) and the last pod start.
	CPUSlope float64 `json:"cpu_pct_per_min"`
	RSSSlope float64 `json:"rss_mb_per_min"`
	// SteadyMinutes is the length of the window the slopes were fitted
	// over; CPUMean and RSSMean are the means over it.
	SteadyMinutes float64 `json:"steady_minutes"`
	CPUMean       float64 `json:"cpu_pct_mean"`
	RSSMean       float64 `json:"rss_mb_mean"`
	// Minutes are the run minute by minute: ADD latency of the pods started
	// in it, the daemon's mean CPU and last RSS.
	Minutes []Minute `json:"minutes"`
	// DaemonCPUPerPod is the daemon's CPU time per started pod (ADD, its
	// flows and DEL), in ms, over the whole run.
	DaemonCPUPerPod float64 `json:"daemon_cpu_ms_per_pod"`
	// Leaks lists what differs from the state before the first pod.
	Leaks []string `json:"leaks"`
	// StaleConntrack counts conntrack entries that still name a deleted
	// pod once every client is gone (the server pod still up).
	StaleConntrack int `json:"stale_conntrack"`
	// PurgeWalks counts the daemon's walks of the conntrack table that purged
	// deleted pods' flows: one serves every DEL of up to a second.
	PurgeWalks int `json:"conntrack_purge_walks"`
}

// OK is the run's verdict: every goal that the run could judge is met.
func (r *Report) OK() bool {
	for _, g := range r.Goals() {
		if g.Verdict == missed {
			return false
		}
	}
	return true
}

type churn struct {
	p      Params
	node   *harness.Node
	server netip.Addr

	mu       sync.Mutex
	free     []*harness.Pod // idle pod netns, reused
	cnis     map[string]*harness.CNI
	start    time.Time // of the churn, for per-minute figures
	adds     []time.Duration
	addAt    []time.Duration // when each of adds started, since start
	dels     []time.Duration
	errs     int
	failures []string
	live     atomic.Int64
	pods     atomic.Int64
}

// Run sets up the node, churns for p.Duration, drains, checks for leaks and
// tears everything down.
func Run(ctx context.Context, p Params) (*Report, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the churn benchmark needs root: it creates network namespaces")
	}
	if err := harness.RequireBinaries(); err != nil {
		return nil, err
	}
	if p.Progress == nil {
		p.Progress = io.Discard
	}
	dir, err := os.MkdirTemp("", "coordino-churn-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	policyDir := filepath.Join(dir, "policies")
	if err := os.MkdirAll(policyDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(policyDir, "policies.yaml"), []byte(policies), 0o600); err != nil {
		return nil, err
	}
	nodeDir := filepath.Join(dir, "node")
	if err := os.MkdirAll(nodeDir, 0o700); err != nil {
		return nil, err
	}
	n, err := harness.NewNode(nodeDir, "churn-"+harness.RandomSuffix(4), harness.NodeOptions{
		PodCIDRs:  []string{podCIDR},
		ExtraArgs: []string{"--policy-dir", policyDir, "--flow-log", filepath.Join(dir, "flows.jsonl")},
	})
	if err != nil {
		return nil, err
	}
	defer n.Close()
	if err := n.StartDaemon(); err != nil {
		return nil, err
	}
	c := &churn{p: p, node: n, cnis: map[string]*harness.CNI{}}
	defer c.closePods()

	before, err := c.snapshot()
	if err != nil {
		return nil, err
	}
	c.start = time.Now()
	server, stopServer, err := c.startServer()
	if err != nil {
		return nil, err
	}

	r := &Report{Date: time.Now().UTC().Format(time.RFC3339), Params: p}
	cpuBefore := harness.ProcCPU(n.DaemonPID())
	samples := c.sample(ctx, &r.Samples)
	c.churn(ctx)
	samples()
	daemonCPU := harness.ProcCPU(n.DaemonPID()) - cpuBefore

	// Every client is gone: no conntrack entry may still name one.
	stale, err := c.staleConntrack()
	if err != nil {
		return nil, err
	}
	stopServer()
	if err := c.del(server); err != nil {
		c.fail(fmt.Errorf("DEL server: %w", err))
	}
	c.release(server.pod) // closed with the other pods
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	r.Leaks = c.leaks(before)
	r.StaleConntrack = stale
	if walks, err := n.Metric("coordino_conntrack_purge_walks_total"); err == nil {
		r.PurgeWalks = int(walks)
	}
	r.Pods = int(c.pods.Load())
	r.Add, r.Del = harness.Summarize(c.adds, 0), harness.Summarize(c.dels, 0)
	r.Minutes = perMinute(r.Samples, c.addAt, c.adds)
	if r.Pods > 0 {
		r.DaemonCPUPerPod = float64(daemonCPU) / float64(time.Millisecond) / float64(r.Pods)
	}
	r.Errors, r.Failures = c.errs, c.failures
	steady := steadyState(r.Samples, 2*p.Lifetime, p.Duration)
	if len(steady) < 2 { // a run too short to ramp up: fit what there is
		steady = steadyState(r.Samples, 0, p.Duration)
	}
	cpu, rss := func(s Sample) float64 { return s.CPUPct }, func(s Sample) float64 { return s.RSSMB }
	r.CPUSlope, r.RSSSlope = slope(steady, cpu), slope(steady, rss)
	r.CPUMean, r.RSSMean = mean(steady, cpu), mean(steady, rss)
	if len(steady) >= 2 {
		r.SteadyMinutes = (steady[len(steady)-1].At - steady[0].At) / 60
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		r.LoadAvg = strings.TrimSpace(string(la))
	}
	return r, nil
}

// slot is a pod being churned: a netns and the attachment made in it.
type slot struct {
	pod *harness.Pod
	cni *harness.CNI
	rt  *libcni.RuntimeConf
}

func (c *churn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs++
	if len(c.failures) < 10 {
		c.failures = append(c.failures, err.Error())
	}
}

// acquire returns an idle pod netns under a fresh container ID.
func (c *churn) acquire(labels map[string]string) (*slot, error) {
	c.mu.Lock()
	var pod *harness.Pod
	if k := len(c.free); k > 0 {
		pod, c.free = c.free[k-1], c.free[:k-1]
	}
	c.mu.Unlock()
	if pod == nil {
		var err error
		if pod, err = harness.NewPod("churn"); err != nil {
			return nil, err
		}
	}
	cni, err := c.cniFor(labels)
	if err != nil {
		c.release(pod)
		return nil, err
	}
	rt := harness.RuntimeConf(pod, "eth0")
	rt.ContainerID = "c" + harness.RandomSuffix(31)
	return &slot{pod: pod, cni: cni, rt: rt}, nil
}

func (c *churn) release(pod *harness.Pod) {
	c.mu.Lock()
	c.free = append(c.free, pod)
	c.mu.Unlock()
}

func (c *churn) closePods() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.free {
		p.Close()
	}
	c.free = nil
}

// cniFor returns the conflist carrying labels the standalone way
// (args.cni.labels); repeated sets share one.
func (c *churn) cniFor(labels map[string]string) (*harness.CNI, error) {
	keyb, _ := json.Marshal(labels)
	key := string(keyb)
	c.mu.Lock()
	defer c.mu.Unlock()
	if cni := c.cnis[key]; cni != nil {
		return cni, nil
	}
	var ls []map[string]string
	for k, v := range labels {
		ls = append(ls, map[string]string{"key": k, "value": v})
	}
	conf, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": network, "plugins": []any{
		map[string]any{"type": "coordino", "runDir": c.node.RunDir, "args": map[string]any{"cni": map[string]any{"labels": ls}}},
	}})
	if err != nil {
		return nil, err
	}
	cni, err := c.node.NewCNI(conf)
	if err != nil {
		return nil, err
	}
	if labels["fresh"] == "" {
		c.cnis[key] = cni
	}
	return cni, nil
}

func (c *churn) add(s *slot) (netip.Addr, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	start := time.Now()
	res, err := s.cni.Add(ctx, s.rt)
	took := time.Since(start)
	if err != nil {
		return netip.Addr{}, err
	}
	c.mu.Lock()
	c.adds = append(c.adds, took)
	c.addAt = append(c.addAt, start.Sub(c.start))
	c.mu.Unlock()
	addrs, err := harness.Addresses(res)
	if err != nil || len(addrs) == 0 {
		return netip.Addr{}, fmt.Errorf("ADD result without address: %v", err)
	}
	return addrs[0], nil
}

func (c *churn) del(s *slot) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	start := time.Now()
	err := s.cni.Del(ctx, s.rt)
	took := time.Since(start)
	if err == nil {
		c.mu.Lock()
		c.dels = append(c.dels, took)
		c.mu.Unlock()
	}
	return err
}

// startServer adds the pod every churned pod connects to.
func (c *churn) startServer() (*slot, func(), error) {
	s, err := c.acquire(map[string]string{"role": "server"})
	if err != nil {
		return nil, nil, err
	}
	addr, err := c.add(s)
	if err != nil {
		return nil, nil, fmt.Errorf("ADD server: %w", err)
	}
	stop, err := harness.Serve(s.pod.NS, addr, serverPort, "server")
	if err != nil {
		return nil, nil, err
	}
	c.server = addr
	return s, stop, nil
}

// churn starts pods at p.Rate until p.Duration has passed, then waits for
// every started pod's DEL.
func (c *churn) churn(ctx context.Context) {
	interval := time.Minute / time.Duration(c.p.Rate)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	end := time.After(c.p.Duration)
	var wg sync.WaitGroup
	start := time.Now()
	lastReport := start
loop:
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			break loop
		case <-end:
			break loop
		case <-tick.C:
		}
		labels := repeatedLabels[i%len(repeatedLabels)]
		if rand.Float64() < c.p.FreshLabels {
			labels = map[string]string{"app": "job", "fresh": strconv.Itoa(i)}
		}
		lifetime := time.Duration((0.5 + rand.Float64()) * float64(c.p.Lifetime))
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.onePod(ctx, labels, lifetime)
		}()
		if time.Since(lastReport) >= time.Minute {
			lastReport = time.Now()
			fmt.Fprintf(c.p.Progress, "churn: %s, %d pods started, %d live, %d errors\n",
				time.Since(start).Round(time.Second), c.pods.Load(), c.live.Load(), c.errCount())
		}
	}
	wg.Wait()
}

func (c *churn) errCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errs
}

// onePod is one pod's life: ADD, one connection to the server, DEL.
func (c *churn) onePod(ctx context.Context, labels map[string]string, lifetime time.Duration) {
	s, err := c.acquire(labels)
	if err != nil {
		c.fail(fmt.Errorf("pod netns: %w", err))
		return
	}
	c.pods.Add(1)
	c.live.Add(1)
	defer c.live.Add(-1)
	if _, err := c.add(s); err != nil {
		c.fail(fmt.Errorf("ADD %v: %w", labels, err))
	} else if got, err := harness.Dial(s.pod.NS, c.server, serverPort); err != nil || got != "server" {
		c.fail(fmt.Errorf("connect from %v to the server: %q %v", labels, got, err))
	}
	select {
	case <-ctx.Done():
	case <-time.After(lifetime):
	}
	// DEL runs even after a failed ADD or a cancel: it is what cleans up.
	if err := c.del(s); err != nil {
		c.fail(fmt.Errorf("DEL %v: %w", labels, err))
		return // keep the netns out of the pool: its attachment may still exist
	}
	c.release(s.pod)
}
