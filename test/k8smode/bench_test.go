package k8smode

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/coordino/coordino/test/harness"
)

var benchPods = flag.Int("k8s-bench-pods", 40, "ADDs measured per mode in BenchmarkAddKubernetesVsStandalone")

// BenchmarkAddKubernetesVsStandalone measures ADD latency (libcni, primary
// mode, datapath on) of a Kubernetes-mode node against a standalone node in
// the same run, alternating between them, and reports the medians and their
// ratio (goal: Kubernetes ≤ 1.1× standalone). Pod objects and the label
// set's Identity exist beforehand, as in steady state. Run with
// go test ./test/k8smode -run '^$' -bench AddKubernetesVsStandalone -benchtime 1x
func BenchmarkAddKubernetesVsStandalone(b *testing.B) {
	_, c, ns, kn := setup(b, "10.62.0.0/24")
	c.identity(b, 2000, ns, clientLabels)
	n := *benchPods
	for i := range n {
		c.pod(b, ns, fmt.Sprintf("p%d", i), kn.Name, clientLabels)
	}
	if err := kn.StartDaemon(); err != nil {
		b.Fatal(err)
	}
	sn, err := harness.NewNode(b.TempDir(), "node-"+harness.RandomSuffix(6), harness.NodeOptions{PodCIDRs: []string{"10.63.0.0/24"}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(sn.Close)
	if err := sn.StartDaemon(); err != nil {
		b.Fatal(err)
	}
	scni, err := sn.NewCNI(sn.PrimaryConflist("k8s", "1.1.0"))
	if err != nil {
		b.Fatal(err)
	}
	standalone := &k8sNode{Node: sn, cni: scni}
	time.Sleep(2 * time.Second) // let the pod informer deliver every Pod object

	measure := func(node *k8sNode, name string) time.Duration {
		hp, err := harness.NewPod(name)
		if err != nil {
			b.Fatal(err)
		}
		defer hp.Close()
		p := &podIn{Pod: hp, rt: harness.RuntimeConfIn(hp, "eth0", ns)}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		if _, err := node.cni.Add(ctx, p.rt); err != nil {
			b.Fatalf("ADD %s: %v", name, err)
		}
		took := time.Since(start)
		if err := node.cni.Del(ctx, p.rt); err != nil {
			b.Fatalf("DEL %s: %v", name, err)
		}
		return took
	}
	b.ResetTimer()
	var kube, std []time.Duration
	for i := range n {
		name := fmt.Sprintf("p%d", i)
		// Alternate which goes first, so drift on a noisy machine hits both.
		if i%2 == 0 {
			kube = append(kube, measure(kn, name))
			std = append(std, measure(standalone, name))
		} else {
			std = append(std, measure(standalone, name))
			kube = append(kube, measure(kn, name))
		}
	}
	b.StopTimer()
	med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	mk, ms := med(kube), med(std)
	b.ReportMetric(float64(mk.Microseconds()), "k8s-add-median-µs")
	b.ReportMetric(float64(ms.Microseconds()), "standalone-add-median-µs")
	b.ReportMetric(float64(mk)/float64(ms), "ratio")
	b.Logf("ADD median over %d pods: Kubernetes mode %v, standalone %v, ratio %.2f", n, mk, ms, float64(mk)/float64(ms))
}
