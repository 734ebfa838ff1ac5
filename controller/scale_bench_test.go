package controller

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	crdfake "github.com/coordino/coordino/api/client/clientset/versioned/fake"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkClusterScale simulates the controller at cluster scale in
// process: objects go into the stores and through the event handlers as an
// informer would deliver them, writes go to client-go's in-memory fake API.
// It reports the time to give every node its blocks (initial and top-up
// once the daemons report usage), to allocate every identity, the heap
// afterwards, and the API writes per pod creation for a known label set.
// The reference is the time to merely cache the same pods in an informer
// store, measured in the same run.
//
//	make bench-controller   (COORDINO_BENCH_NODES, _PODS_PER_NODE, _NAMESPACES)
func BenchmarkClusterScale(b *testing.B) {
	nodes := envInt("COORDINO_BENCH_NODES", 5000)
	perNode := envInt("COORDINO_BENCH_PODS_PER_NODE", 110)
	namespaces := envInt("COORDINO_BENCH_NAMESPACES", 2000)
	for i := 0; i < b.N; i++ {
		runScale(b, nodes, perNode, namespaces)
	}
}

// deploymentsPerNamespace and the label shapes below give a realistic
// cardinality: every namespace runs a few apps in two tiers, pods carry
// per-rollout and per-pod labels the exclusion list removes.
const deploymentsPerNamespace = 10

func podLabels(ns, dep, pod int) map[string]string {
	l := map[string]string{
		"app":                          fmt.Sprintf("app-%d", dep),
		"app.kubernetes.io/name":       fmt.Sprintf("app-%d", dep),
		"app.kubernetes.io/part-of":    fmt.Sprintf("system-%d", ns%100),
		"tier":                         []string{"frontend", "backend"}[dep%2],
		"version":                      fmt.Sprintf("v%d", dep%3),
		"pod-template-hash":            fmt.Sprintf("%08x", (ns*31+dep)*7+pod%2),
		"app.kubernetes.io/managed-by": "helm",
	}
	if dep == 0 {
		l["statefulset.kubernetes.io/pod-name"] = fmt.Sprintf("app-0-%d", pod)
		l["controller-revision-hash"] = fmt.Sprintf("app-0-%x", ns)
	}
	return l
}

func runScale(b *testing.B, nodes, perNode, namespaces int) {
	ctx := context.Background()
	opts := DefaultOptions()
	opts.IdentityBatch = 1024
	pool := &coordinov1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "default", UID: "pool"},
		Spec: coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.0.0.0/8"}, BlockSizeIPv4: 26}}
	core, crd := kubefake.NewClientset(), crdfake.NewSimpleClientset(pool)
	c := New(opts, zap.NewNop(), core, crd, NewStores())

	_ = c.IPPools.Add(pool)
	c.OnIPPool(pool, false)
	for i := 0; i < namespaces; i++ {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns-%d", i),
			Labels: map[string]string{"kubernetes.io/metadata.name": fmt.Sprintf("ns-%d", i), "team": fmt.Sprintf("team-%d", i%50),
				"env": []string{"prod", "staging", "dev"}[i%3]}}}
		_ = c.Namespaces.Add(ns)
		c.OnNamespace(ns, false)
	}

	// Blocks: every node its first block.
	start, cpu0 := time.Now(), cpuTime()
	for i := 0; i < nodes; i++ {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%05d", i),
			Labels: map[string]string{"topology.kubernetes.io/zone": fmt.Sprintf("zone-%d", i%3)}}}
		_ = c.Nodes.Add(n)
		c.OnNode(n)
	}
	if err := c.Drain(ctx); err != nil {
		b.Fatal(err)
	}
	initial, initialCPU := time.Since(start), cpuTime()-cpu0

	// The daemons report 55 of 64 addresses used: every node gets a second
	// block before it runs out.
	start, cpu0 = time.Now(), cpuTime()
	for _, o := range c.NodeConfigs.List() {
		nc := o.(*coordinov1alpha1.NodeConfig).DeepCopy()
		nc.Status.ObservedGeneration = nc.Generation
		for _, blk := range nc.Spec.Blocks {
			nc.Status.Blocks = append(nc.Status.Blocks, coordinov1alpha1.BlockUsage{CIDR: blk.CIDR, Used: 55, Capacity: 64})
		}
		_ = c.NodeConfigs.Update(nc)
		c.OnNodeConfig(nc)
	}
	if err := c.Drain(ctx); err != nil {
		b.Fatal(err)
	}
	topUp, topUpCPU := time.Since(start), cpuTime()-cpu0
	blocks := 0
	for _, o := range c.NodeConfigs.List() {
		blocks += len(o.(*coordinov1alpha1.NodeConfig).Spec.Blocks)
	}
	if blocks != 2*nodes {
		b.Fatalf("%d blocks for %d nodes, want two each", blocks, nodes)
	}

	// Identities: every pod, then allocation.
	pods := make([]*corev1.Pod, 0, nodes*perNode)
	for i := 0; i < nodes*perNode; i++ {
		ns := i % namespaces
		dep := (i / namespaces) % deploymentsPerNamespace
		pods = append(pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i), Namespace: fmt.Sprintf("ns-%d", ns), Labels: podLabels(ns, dep, i)},
			Spec:       corev1.PodSpec{NodeName: fmt.Sprintf("node-%05d", i%nodes)},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning}})
	}
	refStore := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	start, cpu0 = time.Now(), cpuTime()
	for _, p := range pods {
		_ = refStore.Add(p)
	}
	reference, referenceCPU := time.Since(start), cpuTime()-cpu0
	refStore = nil

	writesBefore := total(c.Writes())
	start, cpu0 = time.Now(), cpuTime()
	for _, p := range pods {
		_ = c.Pods.Add(p)
		c.OnPod(p, false)
	}
	if err := c.Drain(ctx); err != nil {
		b.Fatal(err)
	}
	identities, identitiesCPU := time.Since(start), cpuTime()-cpu0
	identityWrites := total(c.Writes()) - writesBefore

	// New pods of known label sets: no API write at all.
	const extra = 10000
	writesBefore = total(c.Writes())
	for i := 0; i < extra; i++ {
		ns := i % namespaces
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("new-%d", i), Namespace: fmt.Sprintf("ns-%d", ns),
			Labels: podLabels(ns, (i/namespaces)%deploymentsPerNamespace, i+7)},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%05d", i%nodes)}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
		_ = c.Pods.Add(p)
		c.OnPod(p, false)
	}
	if err := c.Drain(ctx); err != nil {
		b.Fatal(err)
	}
	perPod := float64(total(c.Writes())-writesBefore) / extra

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	nIdent := len(c.Identities.ListKeys())
	b.ReportMetric(initial.Seconds(), "s-first-blocks")
	b.ReportMetric(topUp.Seconds(), "s-topup-blocks")
	b.ReportMetric(identities.Seconds(), "s-identities")
	b.ReportMetric(identities.Seconds()/reference.Seconds(), "x-identities/cache-only")
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "MiB-heap")
	b.ReportMetric(perPod, "writes/known-pod")
	b.ReportMetric((initialCPU + topUpCPU + identitiesCPU).Seconds(), "cpu-s-all")
	ms2 := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	b.Logf("%d nodes, %d pods, %d namespaces", nodes, nodes*perNode, namespaces)
	b.Logf("blocks: %d; first block per node %s wall / %s CPU, top-up %s wall / %s CPU", blocks, ms2(initial), ms2(initialCPU), ms2(topUp), ms2(topUpCPU))
	b.Logf("identities: %d with %d API writes in %s wall / %s CPU; reference (caching the pods alone) %s wall / %s CPU; ratio %.2f wall, %.2f CPU",
		nIdent, identityWrites, ms2(identities), ms2(identitiesCPU), ms2(reference), ms2(referenceCPU),
		identities.Seconds()/reference.Seconds(), identitiesCPU.Seconds()/referenceCPU.Seconds())
	b.Logf("all blocks + identities: %s wall / %s CPU", ms2(initial+topUp+identities), ms2(initialCPU+topUpCPU+identitiesCPU))
	b.Logf("heap after GC: %.0f MiB (stores, indexes, and the fake API's copies of written objects)", float64(ms.HeapAlloc)/(1<<20))
	b.Logf("API writes per new pod of a known label set: %.3f", perPod)
}

// cpuTime is the process's user+system CPU time: on a shared, loaded
// machine it says more than wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func total(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}
