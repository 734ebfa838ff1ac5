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

// TestAllowedFlowsLeaveRoomForDrops: a pod opening allowed flows faster
// than the daemon reads fills the ring only to 3/4; a drop record of
// another pod still fits, and the allowed records left out are counted
// lost. Without the share, c's flows filled the ring and b's drop record
// was lost with them. The flows are crafted frames (BPF_PROG_TEST_RUN),
// sent while nothing reads the ring.
func TestAllowedFlowsLeaveRoomForDrops(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC}, false)
	c.policies(denyServerIngress)
	if err := c.dp.SetEmitAllowed(true); err != nil {
		t.Fatal(err)
	}
	lost := func() float64 { return gauge(t, c, "coordino_flow_events_lost_total") }
	lost0 := lost()
	// 1 MiB of 72-byte records is about 14,500: send more new flows.
	const flows = 16000
	for i := range flows {
		f := frame(podIPs["c"], podIPs["a"], protoUDP, udp(uint16(10000+i%50000), 53, []byte("q")))
		if !c.fromPod("c", f) {
			t.Fatalf("allowed flow %d dropped", i)
		}
	}
	if lost() == lost0 {
		t.Fatal("no allowed record left out: the ring did not fill, the test proves nothing")
	}
	if c.toPod("b", frame(podIPs["a"], podIPs["b"], protoTCP, tcp(40000, 80, tcpSYN))) {
		t.Fatal("a>b tcp/80 passed; want denied")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	found := make(chan struct{})
	go func() {
		_ = c.dp.ReadFlows(ctx, func(f Flow) {
			if f.Verdict == "dropped" && f.Src == podIPs["a"] && f.Dst == podIPs["b"] && f.DstPort == 80 {
				close(found)
				cancel()
			}
		})
	}()
	select {
	case <-found:
	case <-ctx.Done():
		t.Fatal("the drop record of a>b tcp/80 was lost behind c's allowed flows")
	}
}
