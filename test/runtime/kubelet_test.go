package runtime

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/coordino/coordino/test/testbed"
)

// TestKubelet drives Coordino through a real kubelet: Pods created through the
// API get Coordino addresses and talk to each other, survive a daemon
// restart, wait for the daemon when it is down, and can be deleted while it
// is down. The steps share one bed and run in order.
func TestKubelet(t *testing.T) {
	gate(t, true)
	ctx := context.Background()
	e := newKubeEnv(t, ctx, true)

	var names []string
	var pods map[string]*testbed.Pod
	t.Run("PodsRunningAndConnected", func(t *testing.T) {
		start := time.Now()
		names = e.createPods(t, ctx, "web", testbed.HandlerPrimary, 4)
		pods = e.waitRunning(t, ctx, names, testbed.CoordinoCIDR4, 90*time.Second)
		t.Logf("4 pods Running in %s", time.Since(start).Round(time.Millisecond))
		for i, n := range names {
			from, to := pods[n], pods[names[(i+1)%len(names)]]
			if err := e.podToPod(from, to); err != nil {
				t.Error(err)
			}
		}
		for _, p := range pods {
			if err := echo("tcp", net.JoinHostPort(p.Status.PodIP, "8080")); err != nil {
				t.Errorf("host -> %s: %v", p.Metadata.Name, err)
			}
		}
	})
	if t.Failed() {
		return
	}

	t.Run("DaemonRestartDoesNotDisturbPods", func(t *testing.T) {
		if err := e.d.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		// Established datapath state is the kernel's: traffic keeps flowing.
		for _, p := range pods {
			if err := echo("tcp", net.JoinHostPort(p.Status.PodIP, "8080")); err != nil {
				t.Errorf("daemon down: host -> %s: %v", p.Metadata.Name, err)
			}
		}
		if err := e.b.RestartDaemon(ctx, e.d); err != nil {
			t.Fatal(err)
		}
		after := e.waitRunning(t, ctx, names, testbed.CoordinoCIDR4, 30*time.Second)
		for n, p := range after {
			before := pods[n]
			if p.Status.PodIP != before.Status.PodIP || containerID(p) != containerID(before) {
				t.Errorf("pod %s changed across daemon restart: %s/%s -> %s/%s", n,
					before.Status.PodIP, containerID(before), p.Status.PodIP, containerID(p))
			}
			for _, cs := range p.Status.ContainerStatuses {
				if cs.RestartCount != 0 {
					t.Errorf("pod %s container restarted %d times", n, cs.RestartCount)
				}
			}
		}
		if err := e.podToPod(after[names[0]], after[names[1]]); err != nil {
			t.Error(err)
		}
		if err := daemonHolds(e.d, e.base, true)(len(names)); err != nil {
			t.Errorf("after restart: %v", err)
		}
	})

	t.Run("NewPodsWaitForDaemon", func(t *testing.T) {
		if err := e.d.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		late := e.createPods(t, ctx, "late", testbed.HandlerPrimary, 2)
		// While the daemon is down ADD fails with "try again later": the Pods
		// must stay un-Running (and must not get an address from elsewhere).
		time.Sleep(8 * time.Second)
		for _, n := range late {
			p, err := e.c.Admin.GetPod(ctx, "default", n)
			if err != nil {
				t.Fatal(err)
			}
			if p.Status.Phase == "Running" {
				t.Errorf("pod %s Running while the daemon is down (IP %s)", n, p.Status.PodIP)
			}
		}
		start := time.Now()
		if err := e.b.RestartDaemon(ctx, e.d); err != nil {
			t.Fatal(err)
		}
		e.waitRunning(t, ctx, late, testbed.CoordinoCIDR4, 120*time.Second)
		t.Logf("waiting pods Running %s after the daemon came back", time.Since(start).Round(time.Millisecond))
		names = append(names, late...)
	})

	t.Run("DeleteWhileDaemonDown", func(t *testing.T) {
		if err := e.d.Stop(10 * time.Second); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		e.deletePods(t, ctx, names, 90*time.Second)
		t.Logf("%d pods deleted with the daemon down in %s", len(names), time.Since(start).Round(time.Millisecond))
		if err := e.b.RestartDaemon(ctx, e.d); err != nil {
			t.Fatal(err)
		}
		// The daemon drains the plugin's deletion queue at start.
		assertNoDaemonLeaks(t, e.d, testbed.NetPrimary, e.base)
		if err := e.b.RestartDaemon(ctx, e.d); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("DeleteFreesEverything", func(t *testing.T) {
		names := e.createPods(t, ctx, "again", testbed.HandlerPrimary, 3)
		e.waitRunning(t, ctx, names, testbed.CoordinoCIDR4, 90*time.Second)
		e.deletePods(t, ctx, names, 60*time.Second)
		assertNoRuntimeLeaks(t, e.b, testbed.NetPrimary, false)
		assertNoDaemonLeaks(t, e.d, testbed.NetPrimary, e.base)
		if err := e.b.RestartDaemon(ctx, e.d); err != nil {
			t.Fatal(err)
		}
	})
}

// TestKubeletChained: the chained configuration under kubelet; addresses
// from host-local, Coordino registered on every Pod, cleanup on delete.
func TestKubeletChained(t *testing.T) {
	gate(t, true)
	ctx := context.Background()
	e := newKubeEnv(t, ctx, true)
	names := e.createPods(t, ctx, "chain", testbed.HandlerChained, 3)
	pods := e.waitRunning(t, ctx, names, testbed.ChainedCIDR4, 90*time.Second)
	if err := e.podToPod(pods[names[0]], pods[names[1]]); err != nil {
		t.Error(err)
	}
	if err := daemonHolds(e.d, e.base, false)(len(names)); err != nil {
		t.Error(err)
	}
	e.deletePods(t, ctx, names, 60*time.Second)
	assertNoRuntimeLeaks(t, e.b, testbed.NetChained, false)
	assertNoDaemonLeaks(t, e.d, testbed.NetChained, e.base)
	assertNoIPAMLeaks(t, e.b.Dir+"/cni/ipam-chained")
}

// TestKubeletRuntimeRestarts restarts containerd and kubelet (gracefully and
// by SIGKILL) while Pods are being created and deleted, then checks that once
// everything settles no address, veth, pin or sandbox is left.
func TestKubeletRuntimeRestarts(t *testing.T) {
	gate(t, true)
	ctx := context.Background()
	e := newKubeEnv(t, ctx, true)
	disrupt := []struct {
		name string
		do   func() error
	}{
		{"containerd restart", func() error { return e.b.RestartContainerd(ctx, false) }},
		{"kubelet restart", func() error { return e.b.RestartKubelet(ctx, e.c, false) }},
		{"containerd SIGKILL", func() error { return e.b.RestartContainerd(ctx, true) }},
		{"kubelet SIGKILL", func() error { return e.b.RestartKubelet(ctx, e.c, true) }},
	}
	var all []string
	for round, d := range disrupt {
		names := e.createPods(t, ctx, "churn"+string(rune('a'+round)), testbed.HandlerPrimary, 5)
		all = append(all, names...)
		// Disrupt while kubelet is busy creating the sandboxes.
		time.Sleep(300 * time.Millisecond)
		start := time.Now()
		if err := d.do(); err != nil {
			t.Fatalf("%s: %v", d.name, err)
		}
		t.Logf("%s: back in %s", d.name, time.Since(start).Round(time.Millisecond))
		e.waitRunning(t, ctx, names, testbed.CoordinoCIDR4, 180*time.Second)
		// Delete half of them right away, the rest at the end.
		e.deletePods(t, ctx, names[:2], 90*time.Second)
		if err := daemonHolds(e.d, e.base, true)(countLive(t, ctx, e)); err != nil {
			t.Errorf("after %s: %v", d.name, err)
		}
	}
	var rest []string
	for _, n := range all {
		if _, err := e.c.Admin.GetPod(ctx, "default", n); err == nil {
			rest = append(rest, n)
		}
	}
	e.deletePods(t, ctx, rest, 120*time.Second)
	assertNoRuntimeLeaks(t, e.b, testbed.NetPrimary, true)
	assertNoDaemonLeaks(t, e.d, testbed.NetPrimary, e.base)
}

// countLive counts the Pods the API still has (all are Coordino primary).
func countLive(t *testing.T, ctx context.Context, e *kubeEnv) int {
	t.Helper()
	l, err := e.c.Admin.ListPods(ctx, "default", "")
	if err != nil {
		t.Fatal(err)
	}
	return len(l.Items)
}
