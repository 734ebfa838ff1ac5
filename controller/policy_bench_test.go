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
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	crdfake "github.com/coordino/coordino/api/client/clientset/versioned/fake"
)

// BenchmarkPolicyCompile compiles one PolicyIR per NetworkPolicy for the
// whole cluster, as a freshly elected leader does: 10,000 NetworkPolicies
// in 2,000 namespaces while the controller's pod store holds 550,000 pods
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

// benchNetworkPolicy is the i-th policy of namespace ns, cycling through
// the shapes clusters use: default deny, allow from the app's clients,
// allow from a team's namespaces on a named port, egress to DNS (named) and
// to an ipBlock with an exception, and a tier rule with expressions.
func benchNetworkPolicy(ns, i int) *networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := func(p intstr.IntOrString, proto *corev1.Protocol) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: proto, Port: &p}
	}
	app := fmt.Sprintf("app-%d", i%deploymentsPerNamespace)
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%d", ns), Name: fmt.Sprintf("np-%d", i),
		UID: types.UID(fmt.Sprintf("uid-%d-%d", ns, i)), Generation: 1}}
	spec := &np.Spec
	switch i % 5 {
	case 0:
		spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	case 1:
		spec.PodSelector.MatchLabels = map[string]string{"app": app}
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app + "-client"}}}},
			Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromInt32(8080), &tcp), port(intstr.FromInt32(8443), &tcp)},
		}}
	case 2:
		spec.PodSelector.MatchLabels = map[string]string{"app": app, "tier": "backend"}
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("team-%d", ns%50)}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "frontend"}}}},
			Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromString("http"), &tcp)},
		}}
	case 3:
		spec.PodSelector.MatchLabels = map[string]string{"app": app}
		spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		spec.Egress = []networkingv1.NetworkPolicyEgressRule{
			{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}}}},
				Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromString("dns"), &udp), port(intstr.FromString("dns-tcp"), &tcp)}},
			{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{fmt.Sprintf("10.%d.0.0/16", ns%256)}}}}},
		}
	default:
		spec.PodSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"frontend", "backend"}},
			{Key: "version", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"v0"}}}
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "app", Operator: metav1.LabelSelectorOpExists}}}}},
		}}
	}
	return np
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
		np := benchNetworkPolicy(i%namespaces, i/namespaces)
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
