package nftdp

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/identity"
)

// flowRecorder keeps the events ReadFlows delivers.
type flowRecorder struct {
	mu     sync.Mutex
	events []datapath.Flow
}

// readFlows runs the datapath's flow reader until the test ends.
func (c *cluster) readFlows() *flowRecorder {
	c.t.Helper()
	rec := &flowRecorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.dp.ReadFlows(ctx, func(f datapath.Flow) {
			rec.mu.Lock()
			rec.events = append(rec.events, f)
			rec.mu.Unlock()
		})
	}()
	c.t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			c.t.Errorf("ReadFlows: %v", err)
		}
	})
	// The reader binds the group before any packet is logged to it.
	time.Sleep(50 * time.Millisecond)
	return rec
}

// wait returns the first event matching ok within half a second (the
// kernel sends a batch after 100 ms at the latest).
func (r *flowRecorder) wait(t testing.TB, what string, ok func(datapath.Flow) bool) datapath.Flow {
	t.Helper()
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if evs := r.matching(ok); len(evs) > 0 {
			return evs[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no flow event %s; got %+v", what, r.matching(func(datapath.Flow) bool { return true }))
	return datapath.Flow{}
}

func (r *flowRecorder) matching(ok func(datapath.Flow) bool) []datapath.Flow {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []datapath.Flow
	for _, f := range r.events {
		if ok(f) {
			out = append(out, f)
		}
	}
	return out
}

// TestFlowEventsOfDrops: a denied connection shows as the eBPF
// datapath's flow event: dropped, policy-denied, at the receiving pod's
// ingress, with both identities and the ports.
func TestFlowEventsOfDrops(t *testing.T) {
	c := newCluster(t, false)
	rec := c.readFlows()
	c.policies(serverFromClientsOn80)
	c.expect(false, "c>b tcp/80")
	ids := c.dp.LocalIdentities()
	f := rec.wait(t, "of c>b", func(f datapath.Flow) bool { return f.Src == podIPs["c"] && f.Dst == podIPs["b"] })
	want := datapath.Flow{Endpoint: c.eps["b"].Key, IfIndex: uint32(c.eps["b"].HostIfIndex), Direction: "ingress",
		Verdict: "dropped", Reason: "policy-denied", Protocol: "TCP", Src: podIPs["c"], Dst: podIPs["b"], DstPort: 80,
		LocalIdentity: uint32(ids[c.eps["b"].Key]), RemoteIdentity: uint32(ids[c.eps["c"].Key])}
	want.Time, want.SrcPort = f.Time, f.SrcPort
	if f != want {
		t.Errorf("event\n got %+v\nwant %+v", f, want)
	}
	if time.Since(f.Time) > 5*time.Second || f.SrcPort == 0 {
		t.Errorf("event time %v, source port %d", f.Time, f.SrcPort)
	}
	// Allowed flows only when asked for.
	c.expect(true, "a>b tcp/80")
	time.Sleep(200 * time.Millisecond)
	if evs := rec.matching(func(f datapath.Flow) bool { return f.Verdict == "allowed" }); len(evs) > 0 {
		t.Errorf("allowed flows reported without being asked for: %+v", evs)
	}
}

// TestFlowEventsOfAllowedFlows: with allowed flows asked for, a new
// connection is reported at each pod's chain with the reason the eBPF
// datapath gives (a rule of a policy, or a direction no policy
// isolates); turned off, they stop.
func TestFlowEventsOfAllowedFlows(t *testing.T) {
	c := newCluster(t, false)
	rec := c.readFlows()
	c.policies(serverFromClientsOn80)
	if err := c.dp.SetEmitAllowed(true); err != nil {
		t.Fatal(err)
	}
	if !c.dp.EmitAllowed() {
		t.Fatal("EmitAllowed is false after SetEmitAllowed(true)")
	}
	c.expect(true, "a>b tcp/80")
	ids := c.dp.LocalIdentities()
	a, b := ids[c.eps["a"].Key], ids[c.eps["b"].Key]
	isAB := func(dir string) func(datapath.Flow) bool {
		return func(f datapath.Flow) bool {
			return f.Src == podIPs["a"] && f.Dst == podIPs["b"] && f.Direction == dir && f.DstPort == 80
		}
	}
	eg := rec.wait(t, "a>b egress", isAB("egress"))
	if eg.Verdict != "allowed" || eg.Reason != "not-isolated" || eg.Endpoint != c.eps["a"].Key ||
		eg.LocalIdentity != uint32(a) || eg.RemoteIdentity != uint32(b) {
		t.Errorf("egress event %+v", eg)
	}
	in := rec.wait(t, "a>b ingress", isAB("ingress"))
	if in.Verdict != "allowed" || in.Reason != "policy" || in.Endpoint != c.eps["b"].Key ||
		in.LocalIdentity != uint32(b) || in.RemoteIdentity != uint32(a) {
		t.Errorf("ingress event %+v", in)
	}
	// One event per connection and chain, not per packet.
	time.Sleep(100 * time.Millisecond)
	if n := len(rec.matching(isAB("ingress"))); n != 1 {
		t.Errorf("%d ingress events of one connection, want 1", n)
	}
	// A connection the node opens to a pod never crosses the forward
	// hook; it is reported at the pod's ingress all the same.
	c.expect(true, "node>b tcp/81")
	node := rec.wait(t, "node>b ingress", func(f datapath.Flow) bool {
		return f.Dst == podIPs["b"] && f.Direction == "ingress" && f.DstPort == 81
	})
	if node.Verdict != "allowed" || node.Reason != "host" || node.Endpoint != c.eps["b"].Key ||
		node.RemoteIdentity != uint32(identity.Host) {
		t.Errorf("node's connection's event %+v", node)
	}
	if err := c.dp.SetEmitAllowed(false); err != nil {
		t.Fatal(err)
	}
	before := len(rec.matching(func(f datapath.Flow) bool { return f.Verdict == "allowed" }))
	c.expect(true, "a>b tcp/80", "c>a tcp/80")
	time.Sleep(200 * time.Millisecond)
	if after := len(rec.matching(func(f datapath.Flow) bool { return f.Verdict == "allowed" })); after != before {
		t.Errorf("%d allowed flows reported after SetEmitAllowed(false)", after-before)
	}
}

// TestFlowEventsOfSpoofing: a pod sending from an address not its own is
// reported at its egress as spoofed.
func TestFlowEventsOfSpoofing(t *testing.T) {
	c := newCluster(t, false)
	rec := c.readFlows()
	spoofed := netip.MustParseAddr("198.51.100.98")
	addPodAddr(t, c.pods["a"], spoofed)
	err := c.pods["a"].Do(func() error {
		d := net.Dialer{LocalAddr: &net.UDPAddr{IP: spoofed.AsSlice()}}
		conn, err := d.Dial("udp4", netip.AddrPortFrom(podIPs["b"], 81).String())
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte("spoofed"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f := rec.wait(t, "of the spoofed datagram", func(f datapath.Flow) bool { return f.Src == spoofed })
	if f.Verdict != "dropped" || f.Reason != "spoofed" || f.Direction != "egress" || f.Endpoint != c.eps["a"].Key ||
		f.Protocol != "UDP" || f.DstPort != 81 || f.LocalIdentity != uint32(c.dp.LocalIdentities()[c.eps["a"].Key]) {
		t.Errorf("event %+v", f)
	}
}

// TestFlowLogRateLimited: a pod flooding denied datagrams is reported at
// most at its endpoint's limit, every packet is still counted, and another
// pod's drop meanwhile is reported.
func TestFlowLogRateLimited(t *testing.T) {
	c := newCluster(t, false)
	c.addPod("d", "default", map[string]string{"app": "server"})
	rec := c.readFlows()
	c.policies(serverFromClientsOn80)
	const flood = time.Second
	sent, elapsed := 0, time.Duration(0)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := c.pods["c"].Do(func() error {
			conn, err := net.Dial("udp4", netip.AddrPortFrom(podIPs["b"], 80).String())
			if err != nil {
				return err
			}
			defer conn.Close()
			msg := []byte("flood")
			start := time.Now()
			for end := start.Add(flood); time.Now().Before(end); {
				if _, err := conn.Write(msg); err == nil {
					sent++
				}
			}
			elapsed = time.Since(start)
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(flood / 2)
	c.expect(false, "c>d tcp/81")
	wg.Wait()
	time.Sleep(300 * time.Millisecond)
	floodEvents := len(rec.matching(func(f datapath.Flow) bool { return f.Dst == podIPs["b"] && f.Protocol == "UDP" }))
	// The kernel's token bucket: the burst (and one), then the rate over
	// the flood, with a fifth of a second for packets still queued after it.
	limit := dropLogEndpointBurst + 1 + int(dropLogEndpointRate*(elapsed+200*time.Millisecond)/time.Second)
	t.Logf("%d datagrams sent, %d reported (limit %d)", sent, floodEvents, limit)
	if sent < 10*limit {
		t.Fatalf("only %d datagrams sent in %v: no flood", sent, flood)
	}
	if floodEvents == 0 || floodEvents > limit {
		t.Errorf("%d events of the flood, want 1 to %d", floodEvents, limit)
	}
	rec.wait(t, "of c>d during the flood", func(f datapath.Flow) bool {
		return f.Dst == podIPs["d"] && f.Reason == "policy-denied" && f.Endpoint == c.eps["d"].Key
	})
	drops, err := c.dp.Drops()
	if err != nil || drops["ingress-policy-denied"] < uint64(sent)*9/10 {
		t.Errorf("drops %v (%v) for %d datagrams sent: every packet is counted", drops, err, sent)
	}
}

// TestFlowEventsOfTierDenies: a flow an Admin or Baseline Deny drops is
// reported with its tier's reason (admin-deny, baseline-deny), as the eBPF
// datapath reports it, not only counted.
func TestFlowEventsOfTierDenies(t *testing.T) {
	c := newCluster(t, false)
	rec := c.readFlows()
	s := withCluster(t, snapshotOf(t), `
metadata: {name: deny-ext}
spec:
  tier: Admin
  priority: 3
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: default}}}
  egress:
  - action: Deny
    to: [{networks: [203.0.113.0/24]}]`, `
metadata: {name: baseline-deny}
spec:
  tier: Baseline
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: server}}}}
  ingress:
  - action: Deny
    from: [{namespaces: {}}]`)
	if err := c.dp.UpdatePolicy(s); err != nil {
		t.Fatalf("UpdatePolicy: %v", err)
	}
	c.expect(false, "a>ext tcp/80", "c>b tcp/80")
	ids := c.dp.LocalIdentities()
	for _, w := range []struct {
		from, to, dir, reason string
		local                 string
	}{{"a", "ext", "egress", "admin-deny", "a"}, {"c", "b", "ingress", "baseline-deny", "b"}} {
		f := rec.wait(t, "of "+w.from+">"+w.to, func(f datapath.Flow) bool {
			return f.Src == podIPs[w.from] && f.Dst == podIPs[w.to] && f.Verdict == "dropped"
		})
		if f.Reason != w.reason || f.Direction != w.dir || f.Endpoint != c.eps[w.local].Key ||
			f.LocalIdentity != uint32(ids[c.eps[w.local].Key]) || f.DstPort != 80 {
			t.Errorf("%s>%s: event %+v, want %s %s at %s", w.from, w.to, f, w.dir, w.reason, w.local)
		}
	}
}
