package k8smode

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/test/apiserver"
	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

var (
	scaleNodes = flag.Int("k8s-scale-nodes", 500, "Node objects in BenchmarkClusterOnAPIServer")
	scalePods  = flag.Int("k8s-scale-pods", 20000, "Pod objects (new label sets) in BenchmarkClusterOnAPIServer")
)

// scaleLabelSets is how many distinct pod label sets the benchmark's pods
// use per namespace (apps × versions); pod-template-hash varies per pod
// and is excluded from identities.
const (
	scaleNamespaces = 20
	scaleApps       = 10
	scaleVersions   = 2
)

// BenchmarkClusterOnAPIServer runs coordino-controller (bin/, a process of
// its own, so its CPU and heap are its alone) against a real kube-apiserver
// and measures: Node creation to its NodeConfig listing a block, for
// -k8s-scale-nodes Nodes created at once; Node creation to a real daemon
// (harness netns node, Kubernetes mode) serving an ADD on one more Node
// created last; controller CPU and heap; and controller API writes per Pod
// creation, first for pods of new label sets, then for pods whose label set
// already has an Identity (goal 0). Pod objects are not networked (no
// kubelet): they carry labels and a node name as the scheduler leaves them.
//
//	go test ./test/k8smode -run '^$' -bench ClusterOnAPIServer -benchtime 1x -timeout 30m
func BenchmarkClusterOnAPIServer(b *testing.B) {
	privileged.Require(b)
	if err := harness.RequireBinaries(); err != nil {
		b.Fatal(err)
	}
	c := newCluster(b, apiserver.Start(b).Config)
	c.namespace(b, "coordino-system", nil) // the controller's identity allocator lives there
	ctl := startController(b, c)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	if _, err := c.crd.CoordinoV1alpha1().IPPools().Create(ctx, &coordinov1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "bench"},
		Spec: coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.64.0.0/14"}}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	var namespaces []string
	for i := range scaleNamespaces {
		ns := fmt.Sprintf("scale-%02d-%s", i, harness.RandomSuffix(4))
		c.namespace(b, ns, map[string]string{"team": fmt.Sprint(i % 5), "env": "bench"})
		namespaces = append(namespaces, ns)
	}

	// Watch NodeConfigs from before the first Node exists: the first event
	// with a block is the time the controller served the node.
	served := map[string]time.Time{}
	var mu sync.Mutex
	w, err := c.crd.CoordinoV1alpha1().NodeConfigs().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		for ev := range w.ResultChan() {
			nc, ok := ev.Object.(*coordinov1alpha1.NodeConfig)
			if !ok || ev.Type == watch.Deleted || len(nc.Spec.Blocks) == 0 {
				continue
			}
			mu.Lock()
			if _, seen := served[nc.Name]; !seen {
				served[nc.Name] = time.Now()
			}
			mu.Unlock()
		}
	}()
	b.Cleanup(w.Stop)

	cpu0 := ctl.cpu(b)
	b.ResetTimer()
	n := *scaleNodes
	created := make([]time.Time, n)
	names := make([]string, n)
	start := time.Now()
	parallel(b, n, 16, func(i int) error {
		names[i] = fmt.Sprintf("scale-node-%04d", i)
		created[i] = time.Now()
		_, err := c.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[i]}}, metav1.CreateOptions{})
		return err
	})
	// The real node comes last, while the controller still works through
	// the burst: Node object, then its daemon (as a DaemonSet pod would be
	// started once the node registers), then ADDs until one succeeds.
	kn := newK8sNode(b, c)
	c.pod(b, namespaces[0], "probe", kn.Name, map[string]string{"app": "probe"})
	realCreated := time.Now()
	if _, err := c.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: kn.Name}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if err := kn.StartDaemon(); err != nil {
		b.Fatal(err)
	}
	var realServing time.Duration
	for {
		err := kn.probeAdd(namespaces[0], "probe")
		if err == nil {
			realServing = time.Since(realCreated)
			break
		}
		if time.Since(realCreated) > 5*time.Minute {
			b.Fatalf("no ADD served within 5 minutes of the Node's creation: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	eventually(b, 10*time.Minute, "every Node's NodeConfig lists a block", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(served) >= n+1, fmt.Sprintf("%d of %d", len(served), n+1)
	})
	allBlocks := time.Since(start)
	var lat []time.Duration
	mu.Lock()
	for i, name := range names {
		lat = append(lat, served[name].Sub(created[i]))
	}
	realBlock := served[kn.Name].Sub(realCreated)
	mu.Unlock()
	cpuBlocks := ctl.cpu(b) - cpu0

	// Pods of new label sets: the controller creates their Identities.
	writes0 := ctl.writes(b)
	cpu1 := ctl.cpu(b)
	pods := *scalePods
	podStart := time.Now()
	parallel(b, pods, 16, func(i int) error {
		return createPod(ctx, c, namespaces[i%scaleNamespaces], fmt.Sprintf("p-%06d", i), names[i%n], i)
	})
	sets := scaleNamespaces * scaleApps * scaleVersions
	if pods < sets {
		sets = pods
	}
	eventually(b, 10*time.Minute, "an Identity for every label set", func() (bool, string) {
		l, err := c.crd.CoordinoV1alpha1().Identities().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, err.Error()
		}
		// +1: the probe pod's set.
		return len(l.Items) >= sets+1, fmt.Sprintf("%d of %d", len(l.Items), sets+1)
	})
	podsTook := time.Since(podStart)
	time.Sleep(3 * time.Second) // let the controller settle (pool status, batching)
	writesNew := ctl.writes(b) - writes0
	cpuPods := ctl.cpu(b) - cpu1

	// Pods of label sets that already have an Identity.
	known := max(pods/10, 100)
	writes1 := ctl.writes(b)
	parallel(b, known, 16, func(i int) error {
		return createPod(ctx, c, namespaces[i%scaleNamespaces], fmt.Sprintf("k-%06d", i), names[i%n], i)
	})
	time.Sleep(5 * time.Second)
	writesKnown := ctl.writes(b) - writes1
	b.StopTimer()

	heap := ctl.metric(b, "go_memstats_heap_alloc_bytes")
	slices.Sort(lat)
	q := func(f float64) time.Duration { return lat[min(len(lat)-1, int(f*float64(len(lat))))] }
	b.ReportMetric(q(0.5).Seconds(), "node-to-block-p50-s")
	b.ReportMetric(q(0.99).Seconds(), "node-to-block-p99-s")
	b.ReportMetric(realServing.Seconds(), "node-to-add-s")
	b.ReportMetric(float64(writesKnown)/float64(known), "writes/known-pod")
	b.ReportMetric(float64(writesNew)/float64(pods), "writes/new-set-pod")
	b.ReportMetric(heap/(1<<20), "controller-heap-MiB")
	b.Logf("%d Nodes created at once: NodeConfig with a block after p50 %v, p99 %v, max %v; all in %v; controller CPU %v",
		n, q(0.5).Round(time.Millisecond), q(0.99).Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), allBlocks.Round(time.Millisecond), cpuBlocks)
	b.Logf("real node created last: NodeConfig block after %v, daemon serving ADDs after %v (daemon start included)",
		realBlock.Round(time.Millisecond), realServing.Round(time.Millisecond))
	b.Logf("%d Pods, %d label sets: Identities for all %v after the first create; controller CPU %v, %d writes (%.4f per pod)",
		pods, sets, podsTook.Round(time.Millisecond), cpuPods, writesNew, float64(writesNew)/float64(pods))
	b.Logf("%d more Pods of known label sets: %d controller writes (%.4f per pod); controller heap %.0f MiB",
		known, writesKnown, float64(writesKnown)/float64(known), heap/(1<<20))
}

// probeAdd tries one ADD in a fresh pod netns and undoes it (DEL, netns
// removed) whatever the outcome, as a runtime does after a failed ADD.
func (n *k8sNode) probeAdd(ns, name string) error {
	hp, err := harness.NewPod(name)
	if err != nil {
		return err
	}
	defer hp.Close()
	rt := harness.RuntimeConfIn(hp, "eth0", ns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, addErr := n.cni.Add(ctx, rt)
	if err := n.cni.Del(ctx, rt); err != nil && addErr == nil {
		return fmt.Errorf("DEL after ADD: %w", err)
	}
	return addErr
}

// createPod creates pod i: app and version pick its label set, the
// pod-template-hash (excluded from identities) differs per pod.
func createPod(ctx context.Context, c *cluster, ns, name, node string, i int) error {
	no := false
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{
			"app": fmt.Sprintf("app-%d", (i/scaleNamespaces)%scaleApps), "version": fmt.Sprintf("v%d", (i/(scaleNamespaces*scaleApps))%scaleVersions),
			"pod-template-hash": strconv.FormatInt(int64(i), 36)}},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/pause"}}},
	}
	_, err := c.kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	return err
}

// parallel runs f(0..n-1) on workers goroutines and fails on the first error.
func parallel(b *testing.B, n, workers int, f func(i int) error) {
	b.Helper()
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range n {
		select {
		case next <- i:
		case err := <-errs:
			b.Fatal(err)
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}

// controllerProc is bin/coordino-controller running against the API server.
type controllerProc struct {
	cmd     *exec.Cmd
	metrics string
}

func startController(b *testing.B, c *cluster) *controllerProc {
	b.Helper()
	bin := filepath.Join(harness.BinDir(), "coordino-controller")
	if _, err := os.Stat(bin); err != nil {
		b.Fatalf("%s missing: run make build first", bin)
	}
	return startControllerBinary(b, c, bin)
}

// startControllerBinary runs bin (a coordino-controller of this tree or
// of another release) against the API server until the test ends.
func startControllerBinary(b testing.TB, c *cluster, bin string) *controllerProc {
	b.Helper()
	kc := filepath.Join(b.TempDir(), "kubeconfig")
	harness.WriteKubeconfig(b, c.cfg, harness.APIHostPort(c.cfg), kc)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	log, err := os.Create(filepath.Join(b.TempDir(), "controller.log"))
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig", kc, "--leader-elect=false", "--metrics-addr", addr, "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if b.Failed() {
			out, _ := os.ReadFile(log.Name())
			b.Logf("controller log:\n%s", out)
		}
	})
	p := &controllerProc{cmd: cmd, metrics: "http://" + addr + "/metrics"}
	eventually(b, time.Minute, "controller metrics", func() (bool, string) {
		_, err := p.scrape()
		return err == nil, fmt.Sprint(err)
	})
	return p
}

func (p *controllerProc) scrape() (string, error) {
	r, err := http.Get(p.metrics)
	if err != nil {
		return "", err
	}
	defer r.Body.Close()
	body, err := io.ReadAll(r.Body)
	return string(body), err
}

func (p *controllerProc) metric(b *testing.B, name string) float64 {
	b.Helper()
	body, err := p.scrape()
	if err != nil {
		b.Fatal(err)
	}
	v, err := harness.MetricIn(body, name)
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// writes is the controller's API writes so far (every resource and verb;
// 0 before the first).
func (p *controllerProc) writes(b *testing.B) int64 {
	b.Helper()
	body, err := p.scrape()
	if err != nil {
		b.Fatal(err)
	}
	v, err := harness.MetricIn(body, "coordino_controller_api_writes_total")
	if err != nil && !strings.Contains(err.Error(), "not found") {
		b.Fatal(err)
	}
	return int64(v)
}

// cpu is the controller process's user+system CPU time so far.
func (p *controllerProc) cpu(b *testing.B) time.Duration {
	b.Helper()
	return time.Duration(p.metric(b, "process_cpu_seconds_total") * float64(time.Second))
}
