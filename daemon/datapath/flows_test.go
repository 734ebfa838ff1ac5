package datapath

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestAllowedFlowEventsOnlyWhenWanted: allowed new flows are reported only
// while SetEmitAllowed(true); drops always; counters count every flow.
func TestAllowedFlowEventsOnlyWhenWanted(t *testing.T) {
	c := newCluster(t, AttachTC)
	c.policies(denyServerIngress)
	if c.dp.EmitAllowed() {
		t.Fatal("a fresh datapath reports allowed flows before anyone asked")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flows := make(chan Flow, 1024)
	go func() { _ = c.dp.ReadFlows(ctx, func(f Flow) { flows <- f }) }()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c.dp.Collectors()...)

	// round makes one allowed (a>c) then one denied (a>b) connection and
	// returns the events up to the drop: the ring is FIFO with one reader,
	// so any event of the allowed flow arrives before it.
	round := func() (allowed []Flow) {
		t.Helper()
		c.expect(true, "a>c tcp/80")
		c.expect(false, "a>b tcp/80")
		deadline := time.After(5 * time.Second)
		for {
			select {
			case f := <-flows:
				if f.Verdict == "dropped" && f.Src == podIPs["a"] && f.Dst == podIPs["b"] && f.DstPort == 80 {
					return allowed
				}
				if f.Verdict == "allowed" {
					allowed = append(allowed, f)
				}
			case <-deadline:
				t.Fatal("no flow event for the denied a>b tcp/80")
			}
		}
	}
	notIsolated := func() float64 { return counterValue(t, reg, "coordino_datapath_packets_total", "not-isolated") }

	before := notIsolated()
	if got := round(); len(got) != 0 {
		t.Fatalf("allowed flows reported with no consumer: %+v", got)
	}
	if notIsolated() <= before {
		t.Fatal("unreported allowed flows were not counted")
	}

	if err := c.dp.SetEmitAllowed(true); err != nil {
		t.Fatal(err)
	}
	got := round()
	var sawEgress, sawIngress bool
	for _, f := range got {
		if f.Src == podIPs["a"] && f.Dst == podIPs["c"] && f.DstPort == 80 && f.Reason == "not-isolated" {
			sawEgress = sawEgress || (f.Direction == "egress" && f.Endpoint == c.eps["a"].Key)
			sawIngress = sawIngress || (f.Direction == "ingress" && f.Endpoint == c.eps["c"].Key)
		}
	}
	if !sawEgress || !sawIngress {
		t.Fatalf("a>c not reported at both ends while wanted: %+v", got)
	}

	if err := c.dp.SetEmitAllowed(false); err != nil {
		t.Fatal(err)
	}
	if got := round(); len(got) != 0 {
		t.Fatalf("allowed flows reported after the consumer left: %+v", got)
	}
}
