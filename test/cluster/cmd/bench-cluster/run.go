//go:build linux

package main

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/coordino/coordino/test/cluster"
	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/testbed"
)

const benchNamespace = "density"

// params shape one run; the defaults are issue 12's.
type params struct {
	PodsPerNode   int
	CreateRate    float64       // pods per second, all nodes together
	ChurnPerNode  int           // pods per node per minute
	ChurnDuration time.Duration // how long churn lasts
	Workers       int
}

// result is one CNI's run.
type result struct {
	CNI                    string
	Up                     time.Duration
	Create, Churn          harness.Stats // created → Running through the watch
	NotRunning             int           // pods that never got there while alive
	DeletedBeforeRunning   int           // churn deleted them before they ran
	ChurnAchieved          float64       // replacements per node per minute done
	SandboxP50, SandboxP99 float64       // kubelet_run_podsandbox_duration_seconds, s
	AddP50, AddP99         float64       // Coordino daemons' ADD, s (NaN: reference)
	Adds                   float64
	LabelMisses            float64            // ADDs refused: pod not yet in the daemon's cache
	CNIErrors              map[string]float64 // "verb code N" → count
	Warnings               map[string]int     // reason → count, on pods alive
	WarningSamples         []string
	// Warnings about pods the churn deleted while they started (the
	// kubelet racing the deletion, e.g. "etc-hosts: no such file").
	DeletedWarnings int
	Leaks           map[string][]string // node → footprint lines changed
	DeleteWait      time.Duration       // last pod deleted → nodes back to baseline
}

// tracker follows the bench pods through a watch: when each was created
// (client side, just before the create call) and first seen Running.
type tracker struct {
	mu      sync.Mutex
	created map[string]time.Time
	running map[string]time.Time
	deleted map[string]bool // deleted by the churn
}

func (t *tracker) delete(name string) {
	t.mu.Lock()
	t.deleted[name] = true
	t.mu.Unlock()
}

func (t *tracker) create(name string) {
	t.mu.Lock()
	t.created[name] = time.Now()
	t.mu.Unlock()
}

func (t *tracker) seen(p *corev1.Pod) {
	if p.Status.Phase != corev1.PodRunning {
		return
	}
	t.mu.Lock()
	if _, ok := t.running[p.Name]; !ok {
		t.running[p.Name] = time.Now()
	}
	t.mu.Unlock()
}

// latencies of the named pods that ran; how many of them never ran while
// alive, and how many the churn deleted before they ran (at 500 pods/node/min
// and 110 pods per node a pod lives about 13 s).
func (t *tracker) latencies(names []string) (d []time.Duration, missing, deletedFirst int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range names {
		r, ok := t.running[n]
		if !ok {
			if t.deleted[n] {
				deletedFirst++
			} else {
				missing++
			}
			continue
		}
		d = append(d, r.Sub(t.created[n]))
	}
	return d, missing, deletedFirst
}

func (t *tracker) deletedBeforeRunning(name string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ran := t.running[name]
	return t.deleted[name] && !ran
}

func (t *tracker) allRunning(names []string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, n := range names {
		if _, ok := t.running[n]; !ok && !t.deleted[n] {
			return false
		}
	}
	return true
}

// watchLoop feeds fn every event of the namespace's objects, re-watching
// from the last resourceVersion when the server closes the watch.
func watchLoop(ctx context.Context, start func(rv string) (watch.Interface, error), fn func(watch.Event) string) {
	rv := ""
	for ctx.Err() == nil {
		w, err := start(rv)
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error { // e.g. resourceVersion too old
				rv = ""
				continue
			}
			if got := fn(ev); got != "" {
				rv = got
			}
		}
		w.Stop()
	}
}

// run measures one CNI on a fresh bed and tears it down.
func run(ctx context.Context, cni string, p params, logf func(string, ...any)) (res result, err error) {
	res = result{CNI: cni, Warnings: map[string]int{}, Leaks: map[string][]string{}, CNIErrors: map[string]float64{},
		AddP50: math.NaN(), AddP99: math.NaN()}
	opts := cluster.Options{Workers: p.Workers, MaxPods: p.PodsPerNode + 20, Logf: logf}
	if cni == "reference" {
		opts.SkipInstall, opts.PrimaryCNI = true, "bridge"
	}
	start := time.Now()
	c, err := cluster.Up(ctx, opts)
	if err != nil {
		return res, err
	}
	defer func() {
		if derr := c.Down(); derr != nil && err == nil {
			err = derr
		}
	}()
	res.Up = time.Since(start)
	if err := c.CreateNamespace(ctx, benchNamespace); err != nil {
		return res, err
	}
	baseline, err := settledBaseline(ctx, c)
	if err != nil {
		return res, err
	}
	withDaemon := cni == "coordino"
	before, err := scrapeAll(ctx, c, withDaemon)
	if err != nil {
		return res, err
	}

	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	t := &tracker{created: map[string]time.Time{}, running: map[string]time.Time{}, deleted: map[string]bool{}}
	pods := c.Client.CoreV1().Pods(benchNamespace)
	go watchLoop(wctx, func(rv string) (watch.Interface, error) {
		return pods.Watch(wctx, metav1.ListOptions{ResourceVersion: rv})
	}, func(ev watch.Event) string {
		if p, ok := ev.Object.(*corev1.Pod); ok {
			t.seen(p)
			return p.ResourceVersion
		}
		return ""
	})
	var evMu sync.Mutex
	var warnings []*corev1.Event
	events := c.Client.CoreV1().Events(benchNamespace)
	go watchLoop(wctx, func(rv string) (watch.Interface, error) {
		return events.Watch(wctx, metav1.ListOptions{ResourceVersion: rv, FieldSelector: "type=Warning"})
	}, func(ev watch.Event) string {
		e, ok := ev.Object.(*corev1.Event)
		if !ok {
			return ""
		}
		if ev.Type == watch.Added {
			evMu.Lock()
			warnings = append(warnings, e)
			evMu.Unlock()
		}
		return e.ResourceVersion
	})

	// Creates run concurrently so a slow API call does not lower the rate.
	var wg sync.WaitGroup
	var createErrs []string
	var errMu sync.Mutex
	seq := 0
	perNode := map[string][]string{} // FIFO of each node's live bench pods
	create := func(node string) string {
		seq++
		name := fmt.Sprintf("d-%s-%d", strings.TrimPrefix(node, "worker-"), seq)
		perNode[node] = append(perNode[node], name)
		t.create(name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := pods.Create(ctx, benchPod(name, node), metav1.CreateOptions{}); err != nil {
				errMu.Lock()
				createErrs = append(createErrs, err.Error())
				errMu.Unlock()
			}
		}()
		return name
	}
	waitRunning := func(names []string, what string) {
		_ = testbed.WaitFor(ctx, what, 10*time.Minute, func() error {
			if t.allRunning(names) {
				return nil
			}
			return fmt.Errorf("not all Running")
		})
	}

	// Phase 1: fill every node to PodsPerNode at CreateRate.
	logf("bench %s: creating %d pods per node on %d nodes at %.1f pods/s", cni, p.PodsPerNode, len(c.Nodes), p.CreateRate)
	var created []string
	tick := time.NewTicker(time.Duration(float64(time.Second) / p.CreateRate))
	for i := 0; i < p.PodsPerNode*len(c.Nodes) && ctx.Err() == nil; i++ {
		<-tick.C
		created = append(created, create(c.Nodes[i%len(c.Nodes)]))
	}
	tick.Stop()
	wg.Wait()
	waitRunning(created, "density pods Running")
	d, missing, _ := t.latencies(created)
	res.Create, res.NotRunning = harness.Summarize(d, 0), missing
	logf("bench %s: create phase p50 %.0f ms p99 %.0f ms, %d not Running", cni, res.Create.P50, res.Create.P99, missing)

	// Phase 2: churn, round-robin over nodes, oldest pod of a node first.
	var churned []string
	if p.ChurnDuration > 0 && p.ChurnPerNode > 0 {
		interval := time.Duration(float64(time.Minute) / float64(p.ChurnPerNode*len(c.Nodes)))
		logf("bench %s: churn %d pods/node/min for %s (one replacement every %s)", cni, p.ChurnPerNode, p.ChurnDuration, interval)
		zero := int64(0)
		tick := time.NewTicker(interval)
		end := time.Now().Add(p.ChurnDuration)
		churnStart := time.Now()
		for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
			<-tick.C
			node := c.Nodes[i%len(c.Nodes)]
			old := perNode[node][0]
			perNode[node] = perNode[node][1:]
			t.delete(old)
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = pods.Delete(ctx, old, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			}()
			churned = append(churned, create(node))
		}
		tick.Stop()
		res.ChurnAchieved = float64(len(churned)) / float64(len(c.Nodes)) / time.Since(churnStart).Minutes()
		wg.Wait()
		waitRunning(churned, "churned pods Running")
		d, missing, deletedFirst := t.latencies(churned)
		res.Churn, res.DeletedBeforeRunning = harness.Summarize(d, 0), deletedFirst
		res.NotRunning += missing
		logf("bench %s: churn phase p50 %.0f ms p99 %.0f ms, %d not Running, %d deleted before Running", cni, res.Churn.P50, res.Churn.P99, missing, deletedFirst)
	}
	if len(createErrs) > 0 {
		res.Warnings["create API errors"] += len(createErrs)
		res.WarningSamples = append(res.WarningSamples, createErrs[0])
	}

	evMu.Lock()
	for _, e := range warnings {
		if t.deletedBeforeRunning(e.InvolvedObject.Name) {
			res.DeletedWarnings++
			continue
		}
		res.Warnings[e.Reason]++
		if len(res.WarningSamples) < 5 {
			res.WarningSamples = append(res.WarningSamples, fmt.Sprintf("%s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message))
		}
	}
	evMu.Unlock()

	after, err := scrapeAll(ctx, c, withDaemon)
	if err != nil {
		return res, err
	}
	box := histogramOf(after.kubelet, "kubelet_run_podsandbox_duration_seconds", nil).minus(histogramOf(before.kubelet, "kubelet_run_podsandbox_duration_seconds", nil))
	res.SandboxP50, res.SandboxP99 = box.quantile(0.5), box.quantile(0.99)
	if withDaemon {
		const name = "coordino_cni_request_duration_seconds"
		add := map[string]string{"verb": "ADD"}
		h := histogramOf(after.daemon, name, add).minus(histogramOf(before.daemon, name, add))
		res.AddP50, res.AddP99, res.Adds = h.quantile(0.5), h.quantile(0.99), h.count()
		const misses = "coordino_k8s_pod_label_misses_total"
		res.LabelMisses = sum(after.daemon, misses, nil) - sum(before.daemon, misses, nil)
		for _, s := range after.daemon {
			if s.name == "coordino_cni_errors_total" {
				k := s.labels["verb"] + " code " + s.labels["code"]
				if n := s.value - sum(before.daemon, s.name, s.labels); n > 0 {
					res.CNIErrors[k] += n
				}
			}
		}
	}

	// Phase 3: delete everything; every node must return to its baseline.
	delStart := time.Now()
	if err := deleteAllPods(ctx, c); err != nil {
		return res, err
	}
	_ = testbed.WaitFor(ctx, "nodes at baseline", 5*time.Minute, func() error {
		for _, n := range c.Nodes {
			fp, err := c.NodeFootprint(n)
			if err != nil {
				return err
			}
			if diff := baseline[n].Diff(fp); len(diff) > 0 {
				res.Leaks[n] = diff
			} else {
				delete(res.Leaks, n)
			}
		}
		if len(res.Leaks) > 0 {
			return fmt.Errorf("nodes not back to baseline")
		}
		return nil
	})
	res.DeleteWait = time.Since(delStart)
	for _, n := range sortedKeys(res.Leaks) {
		logf("bench %s: %s not back to baseline:\n  %s", cni, n, strings.Join(res.Leaks[n], "\n  "))
	}
	stopWatch()
	return res, nil
}

// settledBaseline runs one pod per node to completion of its deletion, so
// what a CNI creates once per node (directories, the node's own programs,
// remote nodes' ipcache entries) exists, then waits until every node's
// footprint holds still and returns it.
func settledBaseline(ctx context.Context, c *cluster.Cluster) (map[string]cluster.Footprint, error) {
	pods := c.Client.CoreV1().Pods(benchNamespace)
	for _, n := range c.Nodes {
		if _, err := pods.Create(ctx, benchPod("warmup-"+n, n), metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	err := testbed.WaitFor(ctx, "warm-up pods Running", 3*time.Minute, func() error {
		l, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, p := range l.Items {
			if p.Status.Phase != corev1.PodRunning {
				return fmt.Errorf("%s %s", p.Name, p.Status.Phase)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := deleteAllPods(ctx, c); err != nil {
		return nil, err
	}
	return c.SettledFootprints(ctx, 3*time.Minute)
}

// deleteAllPods deletes the bench namespace's pods (grace 0) and waits
// until the API server has none left.
func deleteAllPods(ctx context.Context, c *cluster.Cluster) error {
	pods := c.Client.CoreV1().Pods(benchNamespace)
	zero := int64(0)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		return err
	}
	return testbed.WaitFor(ctx, "bench pods gone", 5*time.Minute, func() error {
		l, err := pods.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(l.Items) > 0 {
			return fmt.Errorf("%d pods left", len(l.Items))
		}
		return nil
	})
}

func benchPod(name, node string) *corev1.Pod {
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "density"}},
		Spec: corev1.PodSpec{
			// No token volume: the kubelet's work is the sandbox and the
			// pause container, as in the upstream density tests.
			AutomountServiceAccountToken:  new(bool),
			NodeName:                      node,
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name: "pause", Image: cluster.PauseImage, ImagePullPolicy: corev1.PullNever,
			}},
		},
	}
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}
