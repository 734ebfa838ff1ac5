package policy

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coordino/coordino/test/harness"
)

// restartProbeTimeout bounds each round of probes around a restart; denied
// probes always wait this long, so it sets the sampling rate.
const restartProbeTimeout = 200 * time.Millisecond

// echoPort is where the long-lived TCP echo server listens on x/a.
const echoPort = 8080

// flow exchanges small messages over one connection at a steady pace and
// records how each round went.
type flow struct {
	name   string
	conn   net.Conn
	every  time.Duration
	wait   time.Duration
	mu     sync.Mutex
	rounds []round
}

type round struct {
	at time.Time
	ok bool
}

// run loops until stop is closed.
func (f *flow) run(stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	msg := make([]byte, 8)
	buf := make([]byte, 8)
	tick := time.NewTicker(f.every)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		copy(msg, fmt.Sprintf("%8d", i))
		ok := f.exchange(msg, buf)
		f.mu.Lock()
		f.rounds = append(f.rounds, round{time.Now(), ok})
		f.mu.Unlock()
	}
}

// exchange sends msg and waits for its echo. A TCP stream may still
// deliver an older echo after a timeout; it is skipped, not counted.
func (f *flow) exchange(msg, buf []byte) bool {
	_ = f.conn.SetDeadline(time.Now().Add(f.wait))
	if _, err := f.conn.Write(msg); err != nil {
		return false
	}
	for {
		var err error
		if _, isUDP := f.conn.(*net.UDPConn); isUDP {
			_, err = f.conn.Read(buf)
		} else {
			_, err = io.ReadFull(f.conn, buf)
		}
		if err != nil {
			return false
		}
		if bytes.Equal(buf, msg) {
			return true
		}
	}
}

// summary returns rounds and failures, and the time of the first failure.
func (f *flow) summary(from time.Time) (n, failed int, firstFail time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rounds {
		if r.at.Before(from) {
			continue
		}
		n++
		if !r.ok {
			failed++
			if firstFail.IsZero() {
				firstFail = r.at
			}
		}
	}
	return n, failed, firstFail
}

// succeededAfter counts successful rounds after t.
func (f *flow) succeededAfter(t time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.rounds {
		if r.at.After(t) && r.ok {
			n++
		}
	}
	return n
}

func (b *bed) dial(t *testing.T, from peer, proto string, to peer, port int) net.Conn {
	c, err := harness.DialFrom(b.pod(from).pod.NS, proto, b.pod(to).ip, port, 2*time.Second)
	if err != nil {
		t.Fatalf("dial %s %s→%s:%d: %v", proto, from, to, port, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (b *bed) echoServer(t *testing.T) {
	stop, err := harness.ServeTCPEcho(b.pod(peer{"x", "a"}).pod.NS, b.pod(peer{"x", "a"}).ip, echoPort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
}

// restartUnderTraffic: with x/a open only to x/b, an established
// connection keeps flowing and new allowed flows keep opening while the
// daemon is SIGKILLed, absent, and restarted, and a denied flow never gets
// through at any moment.
func (b *bed) restartUnderTraffic(t *testing.T) {
	b.t = t
	xa := peer{"x", "a"}
	if err := b.apply(xaFrom("from-b", `  - podSelector: {matchLabels: {pod: b}}`)); err != nil {
		t.Fatal(err)
	}
	b.echoServer(t)
	allowed := &flow{name: "x/b→x/a tcp", conn: b.dial(t, peer{"x", "b"}, "tcp", xa, echoPort), every: 10 * time.Millisecond, wait: time.Second}
	allowedUDP := &flow{name: "x/b→x/a udp", conn: b.dial(t, peer{"x", "b"}, "udp", xa, 80), every: 10 * time.Millisecond, wait: time.Second}

	// Denied flows are probed back to back (each round waits the full
	// timeout); new allowed flows get a generous timeout so a busy machine
	// cannot fail them, and are re-probed every 10 ms.
	var denied, allowedNew []harness.Probe
	for _, s := range []service{{"tcp", 80}, {"udp", 80}, {"tcp", echoPort}} {
		denied = append(denied, harness.Probe{From: b.pod(peer{"y", "a"}).pod.NS, To: b.pod(xa).ip, Port: s.port, Proto: s.proto})
	}
	for _, s := range []service{{"tcp", 81}, {"udp", 81}} {
		allowedNew = append(allowedNew, harness.Probe{From: b.pod(peer{"x", "b"}).pod.NS, To: b.pod(xa).ip, Port: s.port, Proto: s.proto})
	}
	deniedLoop := &probeLoop{probes: denied, want: harness.Blocked, timeout: restartProbeTimeout}
	allowedLoop := &probeLoop{probes: allowedNew, want: harness.Reached, timeout: time.Second, pause: 10 * time.Millisecond}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt()
	wg.Add(4)
	go allowed.run(stop, &wg)
	go allowedUDP.run(stop, &wg)
	go deniedLoop.run(stop, &wg)
	go allowedLoop.run(stop, &wg)

	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	if err := b.node.StopDaemon(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // no daemon: the pinned programs and maps enforce alone
	restarted := time.Now()
	if err := b.node.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	// The new daemon adopts the pins, then applies its first snapshot.
	time.Sleep(time.Second)
	halt()

	for _, f := range []*flow{allowed, allowedUDP} {
		n, failed, first := f.summary(time.Time{})
		down, _, _ := f.summary(killed)
		up, _, _ := f.summary(restarted)
		if failed > 0 || n < 50 || down-up < 20 || up < 20 {
			t.Errorf("%s: %d rounds (%d after the kill, %d after the restart), %d failed (first at %s); want none failed and traffic in every phase",
				f.name, n, down, up, failed, first.Format("15:04:05.000"))
		}
	}
	for _, l := range []*probeLoop{deniedLoop, allowedLoop} {
		absent := 0
		for _, r := range l.rounds {
			if r.After(killed) && r.Before(restarted) {
				absent++
			}
		}
		if len(l.rounds) < 8 || absent < 2 {
			t.Errorf("only %d probe rounds, %d while the daemon was down", len(l.rounds), absent)
		}
		if len(l.wrong) > 0 {
			t.Errorf("around the restart (killed %s, restarted %s), probes that should be %s: %v",
				killed.Format("15:04:05.000"), restarted.Format("15:04:05.000"), l.want, l.wrong)
		}
	}
	// The restarted daemon enforces the same policy.
	if err := b.expectMatrix(allow().set(anyPod, xa.sel(), allSvc, false).set(pod("x", "b"), xa.sel(), allSvc, true)); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

// probeLoop repeats a set of probes until stopped and records every
// outcome other than want.
type probeLoop struct {
	probes  []harness.Probe
	want    harness.Outcome
	timeout time.Duration
	pause   time.Duration
	rounds  []time.Time
	wrong   []string
}

func (l *probeLoop) run(stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		select {
		case <-stop:
			return
		case <-time.After(l.pause):
		}
		started := time.Now()
		res, err := harness.ProbeAll(l.probes, l.timeout)
		l.rounds = append(l.rounds, started)
		if err != nil {
			l.wrong = append(l.wrong, err.Error())
			continue
		}
		for i, o := range res {
			if o != l.want {
				p := l.probes[i]
				l.wrong = append(l.wrong, fmt.Sprintf("%s →%v:%d %s at %s", p.Proto, p.To, p.Port, o, started.Format("15:04:05.000")))
			}
		}
	}
}

func (p peer) sel() sel { return pod(p.ns, p.pod) }

// updateUnderTraffic: a policy loaded while connections are open cuts the
// ones it denies at their next packet and leaves the allowed one alone.
func (b *bed) updateUnderTraffic(t *testing.T) {
	b.t = t
	xa := peer{"x", "a"}
	if err := b.apply(""); err != nil {
		t.Fatal(err)
	}
	b.echoServer(t)
	keep := &flow{name: "x/b→x/a tcp (stays allowed)", conn: b.dial(t, peer{"x", "b"}, "tcp", xa, echoPort), every: 20 * time.Millisecond, wait: 500 * time.Millisecond}
	cutTCP := &flow{name: "y/b→x/a tcp (denied by the update)", conn: b.dial(t, peer{"y", "b"}, "tcp", xa, echoPort), every: 20 * time.Millisecond, wait: 500 * time.Millisecond}
	cutUDP := &flow{name: "y/c→x/a udp (denied by the update)", conn: b.dial(t, peer{"y", "c"}, "udp", xa, 80), every: 20 * time.Millisecond, wait: 500 * time.Millisecond}
	flows := []*flow{keep, cutTCP, cutUDP}
	revoked0, _ := b.node.Metric("coordino_datapath_packets_total", `reason="policy-revoked"`)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt()
	wg.Add(len(flows))
	for _, f := range flows {
		go f.run(stop, &wg)
	}
	time.Sleep(300 * time.Millisecond)
	written := time.Now()
	if err := b.apply(xaFrom("from-b", `  - podSelector: {matchLabels: {pod: b}}`)); err != nil {
		t.Fatal(err)
	}
	loaded := time.Now()
	time.Sleep(1500 * time.Millisecond)
	halt()

	// Every flow works until the update.
	for _, f := range flows {
		all, failedAll, _ := f.summary(time.Time{})
		after, failedAfter, _ := f.summary(written)
		if before, failedBefore := all-after, failedAll-failedAfter; before < 5 || failedBefore > 0 {
			t.Errorf("%s: %d rounds before the update, %d failed; want all through", f.name, before, failedBefore)
		}
	}
	if n, failed, first := keep.summary(written); failed > 0 || n < 20 {
		t.Errorf("%s: %d rounds after the update, %d failed (first at +%v)", keep.name, n, failed, first.Sub(written))
	}
	for _, f := range []*flow{cutTCP, cutUDP} {
		n, failed, first := f.summary(written)
		switch {
		case failed == 0:
			t.Errorf("%s: still flowing %v after the update was loaded (%d rounds)", f.name, time.Since(loaded), n)
		case first.Sub(loaded) > time.Second: // a round ends up to 500 ms after its packet
			t.Errorf("%s: cut %v after the policy was loaded, want at its next packet", f.name, first.Sub(loaded))
		case f.succeededAfter(first) > 0:
			t.Errorf("%s: %d rounds got through after the cut at +%v", f.name, f.succeededAfter(first), first.Sub(written))
		}
	}
	if revoked, err := b.node.Metric("coordino_datapath_packets_total", `reason="policy-revoked"`); err != nil || revoked <= revoked0 {
		t.Errorf("policy-revoked packets %v → %v (%v), want an increase", revoked0, revoked, err)
	}
}

// newPodDenied: a pod selected by an existing deny-all policy is denied
// from the first packet sent right after ADD returns, in both directions,
// while its node already reaches it. With v6 every probe targets IPv6
// addresses (dual-stack mode).
func (b *bed) newPodDenied(t *testing.T, v6 bool) {
	b.t = t
	addr, wildcard := func(bp *bedPod) netip.Addr { return bp.ip }, netip.IPv4Unspecified()
	if v6 {
		if !b.cidr6.IsValid() {
			t.Fatal("IPv6 probes need a dual-stack bed")
		}
		addr, wildcard = func(bp *bedPod) netip.Addr { return bp.ip6 }, netip.IPv6Unspecified()
	}
	if err := b.apply(denyAll("x")); err != nil {
		t.Fatal(err)
	}
	d := peer{"x", "d"}
	bp := b.newPod(d)
	t.Cleanup(func() { delete(b.pods, d) })
	// Servers bound to the wildcard address before the interface exists, so
	// they answer the very first packet that reaches the pod.
	for _, s := range []service{{"tcp", 80}, {"udp", 80}} {
		var stop func()
		var err error
		if s.proto == "tcp" {
			stop, err = harness.Serve(bp.pod.NS, wildcard, s.port, "x/d")
		} else {
			stop, err = harness.ServeUDPEcho(bp.pod.NS, wildcard, s.port)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
	ya := b.pod(peer{"y", "a"})
	// The deny-all in force before the new pod's ADD: apply waits for the
	// compiled PolicyIR, which the daemon may not have read yet when it
	// already holds as many policies (the case before had one too). An
	// existing pod of x isolated shows the daemon has it.
	xa := b.pod(peer{"x", "a"})
	for deadline := time.Now().Add(10 * time.Second); ; {
		res, err := harness.ProbeAll([]harness.Probe{{From: ya.pod.NS, To: addr(xa), Port: 80, Proto: "tcp"}}, 200*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if res[0] == harness.Blocked {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("deny-all of x not in force on x/a within 10s")
		}
	}
	denied0, _ := b.node.Metric("coordino_datapath_packets_total", `reason="policy-denied"`)

	b.attach(bp, map[string]string{"pod": "d"})
	probes := []harness.Probe{
		{From: ya.pod.NS, To: addr(bp), Port: 80, Proto: "tcp"},
		{From: ya.pod.NS, To: addr(bp), Port: 80, Proto: "udp"},
		{From: bp.pod.NS, To: addr(ya), Port: 80, Proto: "tcp"},
		{From: bp.pod.NS, To: addr(ya), Port: 80, Proto: "udp"},
		{From: b.node.NS, To: addr(bp), Port: 80, Proto: "tcp"},
		{From: b.node.NS, To: addr(bp), Port: 80, Proto: "udp"},
	}
	// A generous timeout: the allowed node probes must not fail on a busy
	// machine.
	res, err := harness.ProbeAll(probes, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"y/a→x/d", "y/a→x/d", "x/d→y/a", "x/d→y/a", "node→x/d", "node→x/d"}
	for i, o := range res {
		want := harness.Blocked
		if i >= 4 {
			want = harness.Reached
		}
		if o != want {
			t.Errorf("first %s %s:%d right after ADD: %s, want %s", probes[i].Proto, names[i], probes[i].Port, o, want)
		}
	}
	if denied, err := b.node.Metric("coordino_datapath_packets_total", `reason="policy-denied"`); err != nil || denied < denied0+4 {
		t.Errorf("policy-denied packets %v → %v (%v), want at least 4 more", denied0, denied, err)
	}
}

// udpRevokedOnIsolated: a UDP flow allowed into x/a while x/a was already
// isolated is cut by an update that denies its client, and a new flow on
// the same ports stays denied, although x/a's egress is open (so x/a
// could have opened the flow). The eBPF datapath once marked such a flow
// ambiguous and kept it: a matrix probe's flow let a later denied probe
// that happened to draw the same source port through, for up to 180 s.
func (b *bed) udpRevokedOnIsolated(t *testing.T) {
	b.t = t
	xa, ya := b.pod(peer{"x", "a"}), b.pod(peer{"y", "a"})
	probe := []harness.Probe{{From: ya.pod.NS, To: xa.ip, Port: 80, Proto: "udp", SourcePort: 40000 + rand.IntN(20000)}}
	if err := b.apply(xaFrom("from-b-and-y", `  - podSelector: {matchLabels: {pod: b}}
  - namespaceSelector: {matchLabels: {ns: "y"}}`)); err != nil {
		t.Fatal(err)
	}
	// A generous timeout: the allowed exchange must not fail on a busy machine.
	if res, err := harness.ProbeAll(probe, time.Second); err != nil || res[0] != harness.Reached {
		t.Fatalf("y/a→x/a udp/80 from port %d under a policy allowing it: %v (%v)", probe[0].SourcePort, res, err)
	}
	if err := b.apply(xaFrom("from-b", `  - podSelector: {matchLabels: {pod: b}}`)); err != nil {
		t.Fatal(err)
	}
	if res, err := harness.ProbeAll(probe, restartProbeTimeout); err != nil || res[0] != harness.Blocked {
		t.Fatalf("y/a→x/a udp/80 from port %d after the update denying y: %v (%v), want blocked", probe[0].SourcePort, res, err)
	}
}
