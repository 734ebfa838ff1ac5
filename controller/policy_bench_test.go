package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	crdfake "github.com/coordino/coordino/api/client/clientset/versioned/fake"
	"github.com/coordino/coordino/test/policygen"
)

// BenchmarkPolicyCompile compiles one PolicyIR per NetworkPolicy for the
// whole cluster, as a freshly elected leader does: 10,000 NetworkPolicies
// (test/policygen's shapes) in 2,000 namespaces while the controller's pod store holds 550,000 pods
// (the IR is selector-based, so compiling reads no pod, but the pods are
// what the controller's heap holds anyway). Each policy goes through the
// compiler's sync (validate, compile, create the PolicyIR, write its Valid
// status) against client-go's in-memory fake API. The reference, in the
// same run, is JSON-encoding every NetworkPolicy once: the least any
// publisher of one object per policy pays. Reports wall and CPU time, the
// heap after GC, and the process's peak RSS.
//
//	make bench-controller   (COORDINO_BENCH_POLICIES, _PODS, _NAMESPACES)
func BenchmarkPolicyCompile(b *testing.B) {
	policies := envInt("COORDINO_BENCH_POLICIES", 10000)
	pods := envInt("COORDINO_BENCH_PODS", 550000)
	namespaces := envInt("COORDINO_BENCH_NAMESPACES", 2000)
	for i := 0; i < b.N; i++ {
		runPolicyCompile(b, policies, pods, namespaces)
	}
}

func runPolicyCompile(b *testing.B, policies, pods, namespaces int) {
	ctx := context.Background()
	stores := NewStores()
	for i := 0; i < pods; i++ {
		ns := i % namespaces
		_ = stores.Pods.Add(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pod-%d", i), Namespace: fmt.Sprintf("ns-%d", ns),
				Labels: podLabels(ns, (i/namespaces)%deploymentsPerNamespace, i)},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%05d", i/110)}, Status: corev1.PodStatus{Phase: corev1.PodRunning}})
	}
	netpols := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	var keys []string
	for i := 0; i < policies; i++ {
		np := policygen.NetworkPolicy(i%namespaces, i/namespaces)
		_ = netpols.Add(np)
		keys = append(keys, np.Namespace+"/"+np.Name)
	}

	start, cpu0 := time.Now(), cpuTime()
	for _, k := range keys {
		obj, _, _ := netpols.GetByKey(k)
		if _, err := json.Marshal(obj); err != nil {
			b.Fatal(err)
		}
	}
	reference, referenceCPU := time.Since(start), cpuTime()-cpu0

	pc := NewPolicyCompiler(zap.NewNop(), kubefake.NewClientset(), crdfake.NewSimpleClientset(), record.NewFakeRecorder(16))
	pc.netpols, pc.irs = netpols, cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	start, cpu0 = time.Now(), cpuTime()
	for _, k := range keys {
		if err := pc.sync(ctx, k); err != nil {
			b.Fatalf("%s: %v", k, err)
		}
	}
	compile, compileCPU := time.Since(start), cpuTime()-cpu0
	irs, err := pc.crd.CoordinoV1alpha1().PolicyIRs("").List(ctx, metav1.ListOptions{})
	if err != nil || len(irs.Items) != policies {
		b.Fatalf("%d PolicyIRs (%v), want %d", len(irs.Items), err, policies)
	}
	named := 0
	for _, ir := range irs.Items {
		for _, r := range ir.Spec.Rules {
			named += len(r.NamedPorts)
		}
	}
	irs = nil

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	runtime.KeepAlive(stores)
	runtime.KeepAlive(pc)
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	b.ReportMetric(compile.Seconds(), "s-compile-all")
	b.ReportMetric(compileCPU.Seconds(), "cpu-s-compile-all")
	b.ReportMetric(compileCPU.Seconds()/referenceCPU.Seconds(), "x-cpu/json-encode")
	b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "MiB-heap")
	b.ReportMetric(float64(ru.Maxrss)/(1<<10), "MiB-peak-rss")
	ms2 := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	b.Logf("%d NetworkPolicies in %d namespaces, %d pods cached; %d PolicyIRs with %d named ports", policies, namespaces, pods, policies, named)
	b.Logf("compile + publish all: %s wall / %s CPU (%.1f µs CPU per policy); reference (JSON-encode each policy once) %s wall / %s CPU",
		ms2(compile), ms2(compileCPU), float64(compileCPU.Microseconds())/float64(policies), ms2(reference), ms2(referenceCPU))
	b.Logf("heap after GC %.0f MiB (pods, policies, the fake API's PolicyIRs); peak RSS of the process %.0f MiB",
		float64(ms.HeapAlloc)/(1<<20), float64(ru.Maxrss)/(1<<10))
}
