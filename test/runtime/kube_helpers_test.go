package runtime

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/coordino/coordino/test/testbed"
)

// kubeEnv is a full bed: containerd, etcd, kube-apiserver, kubelet, and a
// Coordino daemon. The default handler and the "coordino" RuntimeClass use
// Coordino primary, "chained" bridge+host-local+Coordino and "bridge" the
// reference network alone.
type kubeEnv struct {
	b    *testbed.Bed
	c    *testbed.Cluster
	d    *testbed.Daemon
	base float64 // daemon addresses in use before any pod
}

// newKubeEnv starts the full bed; with kubelet=false the caller starts kubelet
// later (startKubelet), e.g. to use crictl alone first: kubelet stops any
// sandbox it did not create.
func newKubeEnv(t *testing.T, ctx context.Context, kubelet bool) *kubeEnv {
	t.Helper()
	b := newBed(t, ctx, true)
	start := time.Now()
	c, err := b.StartControlPlane(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd + kube-apiserver ready in %s", time.Since(start).Round(time.Millisecond))
	if err := c.CreateRuntimeClasses(ctx); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, ctx, b, testbed.CoordinoCIDR4)
	primary := []map[string]any{testbed.CoordinoPlugin(d.RunDir)}
	confs := []struct {
		handler, name string
		plugins       []map[string]any
	}{
		{testbed.HandlerDefault, testbed.NetPrimary, primary},
		{testbed.HandlerPrimary, testbed.NetPrimary, primary},
		{testbed.HandlerChained, testbed.NetChained, append(b.BridgePlugins(testbed.ChainedCIDR4, "ipam-chained"), testbed.CoordinoPlugin(d.RunDir))},
		{testbed.HandlerBridge, testbed.NetBridge, b.BridgePlugins(testbed.BridgeCIDR4, "ipam-bridge")},
	}
	for _, cf := range confs {
		if err := b.WriteConflist(cf.handler, cf.name, cf.plugins); err != nil {
			t.Fatal(err)
		}
	}
	e := &kubeEnv{b: b, c: c, d: d, base: usedBaseline(t, d)}
	if kubelet {
		e.startKubelet(t, ctx)
	}
	return e
}

func (e *kubeEnv) startKubelet(t *testing.T, ctx context.Context) {
	t.Helper()
	start := time.Now()
	if err := e.b.StartKubelet(ctx, e.c); err != nil {
		t.Fatal(err)
	}
	t.Logf("kubelet: node Ready in %s", time.Since(start).Round(time.Millisecond))
}

// createPods creates Pods named prefix-0..n-1 on a RuntimeClass.
func (e *kubeEnv) createPods(t *testing.T, ctx context.Context, prefix, runtimeClass string, n int) []string {
	t.Helper()
	var names []string
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		p := testbed.ProbePod(name, runtimeClass, map[string]string{"e2e": prefix})
		if _, err := e.c.Admin.CreatePod(ctx, p); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	return names
}

// waitRunning waits until every named Pod is Running with an IP inside cidr
// and returns the Pods.
func (e *kubeEnv) waitRunning(t *testing.T, ctx context.Context, names []string, cidr string, timeout time.Duration) map[string]*testbed.Pod {
	t.Helper()
	prefix := netip.MustParsePrefix(cidr)
	pods := map[string]*testbed.Pod{}
	err := testbed.WaitFor(ctx, "pods Running", timeout, func() error {
		for _, n := range names {
			if _, ok := pods[n]; ok {
				continue
			}
			p, err := e.c.Admin.GetPod(ctx, "default", n)
			if err != nil {
				return err
			}
			if p.Status.Phase != "Running" || p.Status.PodIP == "" {
				return fmt.Errorf("pod %s is %s", n, p.Status.Phase)
			}
			ip, err := netip.ParseAddr(p.Status.PodIP)
			if err != nil || !prefix.Contains(ip) {
				return fmt.Errorf("pod %s IP %q not in %s", n, p.Status.PodIP, cidr)
			}
			pods[n] = p
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pods
}

// deletePods deletes Pods and waits until the API no longer has them, i.e.
// kubelet finished tearing them down (nothing stuck in Terminating).
func (e *kubeEnv) deletePods(t *testing.T, ctx context.Context, names []string, timeout time.Duration) {
	t.Helper()
	for _, n := range names {
		if err := e.c.Admin.DeletePod(ctx, "default", n); err != nil {
			t.Fatal(err)
		}
	}
	err := testbed.WaitFor(ctx, "pods gone", timeout, func() error {
		for _, n := range names {
			p, err := e.c.Admin.GetPod(ctx, "default", n)
			if testbed.IsNotFound(err) {
				continue
			}
			if err != nil {
				return err
			}
			return fmt.Errorf("pod %s still there (phase %s, terminating=%v)", n, p.Status.Phase, p.Metadata.DeletionTimestamp != nil)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// containerID returns the probe container's CRI id.
func containerID(p *testbed.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == "probe" {
			_, id, _ := strings.Cut(cs.ContainerID, "://")
			return id
		}
	}
	return ""
}

// podToPod runs the probe client inside from's container against to's IP,
// over TCP and UDP.
func (e *kubeEnv) podToPod(from, to *testbed.Pod) error {
	id := containerID(from)
	if id == "" {
		return fmt.Errorf("pod %s has no container id", from.Metadata.Name)
	}
	for _, network := range []string{"tcp", "udp"} {
		addr := to.Status.PodIP + ":8080"
		if strings.Contains(to.Status.PodIP, ":") {
			addr = "[" + to.Status.PodIP + "]:8080"
		}
		if out, err := e.b.Crictl("exec", id, "/probe", "dial", network, addr); err != nil {
			return fmt.Errorf("%s -> %s %s: %v %s", from.Metadata.Name, to.Metadata.Name, network, err, out)
		}
	}
	return nil
}
