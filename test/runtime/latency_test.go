package runtime

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/coordino/coordino/test/testbed"
)

// latencyRounds per network; the networks alternate so both see the same
// machine load.
const latencyRounds = 20

// TestLatency measures, in one run and alternating between the two networks,
// RunPodSandbox (crictl runp wall time, which includes crictl's own start) and
// Pod created -> Running seen through a watch, for Coordino primary against
// bridge + host-local. It reports p50/p90 and ratios; it asserts nothing
// about speed (a 2-core CI box is too noisy for timed assertions).
func TestLatency(t *testing.T) {
	gate(t, true)
	ctx := context.Background()
	e := newKubeEnv(t, ctx, false)
	nets := []struct{ handler, cidr string }{
		{testbed.HandlerPrimary, testbed.CoordinoCIDR4},
		{testbed.HandlerBridge, testbed.BridgeCIDR4},
	}

	// RunPodSandbox through CRI directly, before kubelet starts (it would
	// stop sandboxes it does not know).
	dir := t.TempDir()
	sandbox, stop := map[string]durations{}, map[string]durations{}
	for i := 0; i < latencyRounds; i++ {
		for _, n := range nets {
			id, _, took := runp(t, e.b, n.handler, sandboxConfig(t, dir, fmt.Sprintf("lat-%s-%d", n.handler, i)))
			sandbox[n.handler] = append(sandbox[n.handler], took)
			start := time.Now()
			stopRemove(t, e.b, id)
			stop[n.handler] = append(stop[n.handler], time.Since(start))
		}
	}

	// Pod created -> Running through kubelet, one Pod at a time.
	e.startKubelet(t, ctx)
	events := make(chan running, 64)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	list, err := e.c.Admin.ListPods(ctx, "default", "e2e=lat")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = e.c.Admin.WatchPods(wctx, "default", "e2e=lat", list.Metadata.ResourceVersion, func(typ string, p *testbed.Pod) bool {
			if p.Status.Phase == "Running" && p.Status.PodIP != "" {
				events <- running{p.Metadata.Name, time.Now()}
			}
			return true
		})
	}()
	toRunning := map[string]durations{}
	var created []string
	for i := 0; i < latencyRounds; i++ {
		for _, n := range nets {
			name := fmt.Sprintf("lat-%s-%d", n.handler, i)
			p := testbed.ProbePod(name, n.handler, map[string]string{"e2e": "lat"})
			start := time.Now()
			if _, err := e.c.Admin.CreatePod(ctx, p); err != nil {
				t.Fatal(err)
			}
			created = append(created, name)
			toRunning[n.handler] = append(toRunning[n.handler], waitEvent(t, events, name, start))
		}
		// Keep the node small: delete this round's Pods before the next.
		e.deletePods(t, ctx, created, 60*time.Second)
		created = nil
	}

	// The daemon's own view: mean time serving ADD and DEL (its histogram).
	if m, err := e.d.Metrics(); err == nil {
		for _, verb := range []string{"ADD", "DEL"} {
			sum := m[`coordino_cni_request_duration_seconds_sum{code="0",verb="`+verb+`"}`]
			n := m[`coordino_cni_request_duration_seconds_count{code="0",verb="`+verb+`"}`]
			if n > 0 {
				t.Logf("coordino-daemon %s: mean %s over %v requests", verb, time.Duration(sum/n*float64(time.Second)).Round(10*time.Microsecond), n)
			}
		}
	}
	c, r := testbed.HandlerPrimary, testbed.HandlerBridge
	t.Logf("RunPodSandbox (crictl runp)  coordino %s | bridge+host-local %s | ratio p50 %.2f p90 %.2f",
		sandbox[c], sandbox[r], ratio(sandbox[c].pct(50), sandbox[r].pct(50)), ratio(sandbox[c].pct(90), sandbox[r].pct(90)))
	t.Logf("StopPodSandbox+Remove        coordino %s | bridge+host-local %s | ratio p50 %.2f p90 %.2f",
		stop[c], stop[r], ratio(stop[c].pct(50), stop[r].pct(50)), ratio(stop[c].pct(90), stop[r].pct(90)))
	t.Logf("Pod created -> Running       coordino %s | bridge+host-local %s | ratio p50 %.2f p90 %.2f",
		toRunning[c], toRunning[r], ratio(toRunning[c].pct(50), toRunning[r].pct(50)), ratio(toRunning[c].pct(90), toRunning[r].pct(90)))
}

type running struct {
	name string
	at   time.Time
}

func waitEvent(t *testing.T, ch <-chan running, name string, start time.Time) time.Duration {
	t.Helper()
	timeout := time.After(90 * time.Second)
	for {
		select {
		case ev := <-ch:
			if ev.name == name {
				return ev.at.Sub(start)
			}
		case <-timeout:
			t.Fatalf("pod %s not Running after 90s", name)
		}
	}
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
