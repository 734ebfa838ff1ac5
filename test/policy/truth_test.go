package policy

import (
	"fmt"
	"strings"
	"time"

	"github.com/coordino/coordino/test/harness"
)

// peer names a pod (namespace and pod label) or, with ns == "", the node.
type peer struct{ ns, pod string }

func (p peer) String() string {
	if p.ns == "" {
		return "node"
	}
	return p.ns + "/" + p.pod
}

var (
	namespaces = []string{"x", "y", "z"}
	podNames   = []string{"a", "b", "c"}
	// pods are the probe targets, in matrix column order.
	pods = func() []peer {
		var out []peer
		for _, ns := range namespaces {
			for _, p := range podNames {
				out = append(out, peer{ns, p})
			}
		}
		return out
	}()
	nodePeer = peer{}
	// sources are the probe origins: every pod, then the node.
	sources = append(append([]peer(nil), pods...), nodePeer)
)

// service is a protocol and port every pod serves.
type service struct {
	proto string
	port  int
}

func (s service) String() string { return fmt.Sprintf("%s/%d", strings.ToUpper(s.proto), s.port) }

var services = []service{{"tcp", 80}, {"tcp", 81}, {"udp", 80}, {"udp", 81}}

// sel picks peers; svcSel picks services.
type (
	sel    func(peer) bool
	svcSel func(service) bool
)

func anyPod(p peer) bool { return p.ns != "" }
func inNS(ns string) sel { return func(p peer) bool { return p.ns == ns } }
func pod(ns, name string) sel {
	return func(p peer) bool { return p.ns == ns && p.pod == name }
}
func labelled(name string) sel { return func(p peer) bool { return p.ns != "" && p.pod == name } }
func or(s ...sel) sel {
	return func(p peer) bool {
		for _, f := range s {
			if f(p) {
				return true
			}
		}
		return false
	}
}
func not(s sel) sel { return func(p peer) bool { return anyPod(p) && !s(p) } }

func allSvc(service) bool      { return true }
func tcp(port int) svcSel      { return func(s service) bool { return s.proto == "tcp" && s.port == port } }
func udp(port int) svcSel      { return func(s service) bool { return s.proto == "udp" && s.port == port } }
func proto(name string) svcSel { return func(s service) bool { return s.proto == name } }
func svcNot(f svcSel) svcSel   { return func(s service) bool { return !f(s) } }
func svcOr(fs ...svcSel) svcSel {
	return func(s service) bool {
		for _, f := range fs {
			if f(s) {
				return true
			}
		}
		return false
	}
}

// Matrix dimensions: nine pods, plus the node as a source, four services.
const (
	nPods     = 9
	nSources  = nPods + 1
	nServices = 4
)

// truth is the expected reachability of every (source, target, service).
type truth struct {
	ok [nSources][nPods][nServices]bool
}

func allow() *truth { return fill(true) }
func deny() *truth  { return fill(false) }

func fill(v bool) *truth {
	t := &truth{}
	for i := range t.ok {
		for j := range t.ok[i] {
			for k := range t.ok[i][j] {
				t.ok[i][j][k] = v
			}
		}
	}
	return t
}

// set sets the expectation of every matching triple; later calls win, so
// a case reads as "start from X, then these exceptions".
func (t *truth) set(from, to sel, svc svcSel, v bool) *truth {
	for i, f := range sources {
		for j, d := range pods {
			for k, s := range services {
				if from(f) && to(d) && svc(s) {
					t.ok[i][j][k] = v
				}
			}
		}
	}
	return t
}

// final applies the rules no policy can override: a pod always reaches
// itself (over loopback, never through its veth), and traffic from the
// pod's own node is always allowed (kubelet probes).
func (t *truth) final() *truth {
	c := *t
	for i, f := range sources {
		for j, d := range pods {
			for k := range services {
				if f == d || f == nodePeer {
					c.ok[i][j][k] = true
				}
			}
		}
	}
	return &c
}

// observed is what a probe run saw, in truth's layout.
type observed [nSources][nPods][nServices]harness.Outcome

// mismatches counts triples where reachability differs from the truth.
func (o *observed) mismatches(t *truth) int {
	n := 0
	for i := range o {
		for j := range o[i] {
			for k := range o[i][j] {
				if (o[i][j][k] == harness.Reached) != t.ok[i][j][k] {
					n++
				}
			}
		}
	}
	return n
}

// diff renders one grid per service with a mismatch: rows are sources,
// columns targets. '.' allowed as expected, '-' blocked as expected,
// 'A' allowed but should be blocked, 'B' blocked but should be allowed,
// 'R'/'F' refused/failed where it should have been allowed.
func (o *observed) diff(t *truth) string {
	var b strings.Builder
	for k, s := range services {
		bad := 0
		var g strings.Builder
		fmt.Fprintf(&g, "  %-6s", "from\\to")
		for _, d := range pods {
			fmt.Fprintf(&g, " %-3s", d)
		}
		g.WriteString("\n")
		for i, f := range sources {
			fmt.Fprintf(&g, "  %-7s", f)
			for j := range pods {
				got, want := o[i][j][k], t.ok[i][j][k]
				c := "."
				switch {
				case got == harness.Reached && want:
				case got != harness.Reached && !want:
					c = "-"
				case got == harness.Reached:
					c, bad = "A", bad+1
				case got == harness.Refused:
					c, bad = "R", bad+1
				case got == harness.Failed:
					c, bad = "F", bad+1
				default:
					c, bad = "B", bad+1
				}
				fmt.Fprintf(&g, " %-3s", c)
			}
			g.WriteString("\n")
		}
		if bad > 0 {
			fmt.Fprintf(&b, "%s: %d wrong ('.' allowed, '-' blocked as expected; A allowed but want blocked; B/R/F blocked/refused/failed but want allowed)\n%s",
				s, bad, g.String())
		}
	}
	return b.String()
}

// probeMatrix probes every (source, target, service) at once.
func (b *bed) probeMatrix(timeout time.Duration) (*observed, error) {
	var probes []harness.Probe
	for _, f := range sources {
		from := b.node.NS
		if f != nodePeer {
			from = b.pod(f).pod.NS
		}
		for _, d := range pods {
			for _, s := range services {
				probes = append(probes, harness.Probe{From: from, To: b.pod(d).ip, Port: s.port, Proto: s.proto})
			}
		}
	}
	res, err := harness.ProbeAll(probes, timeout)
	if err != nil {
		return nil, err
	}
	var o observed
	n := 0
	for i := range sources {
		for j := range pods {
			for k := range services {
				o[i][j][k] = res[n]
				n++
			}
		}
	}
	return &o, nil
}

// expectMatrix probes until the matrix equals want or the deadline passes.
// The policy is already loaded when this runs; retries only absorb a slow
// machine (a lost first SYN is not retransmitted within the probe timeout),
// so each retry doubles the timeout.
func (b *bed) expectMatrix(want *truth) error {
	want = want.final()
	deadline := time.Now().Add(4 * time.Second)
	timeout := probeTimeout
	for attempt := 1; ; attempt++ {
		o, err := b.probeMatrix(timeout)
		if err != nil {
			return err
		}
		if o.mismatches(want) == 0 {
			if attempt > 1 {
				b.t.Logf("matrix matched on attempt %d", attempt)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("reachability differs from the truth table after %d attempts (probe timeout %v):\n%s",
				attempt, timeout, o.diff(want))
		}
		timeout = min(2*timeout, time.Second)
	}
}

// probeTimeout is how long a probe waits for a handshake or an echo before
// calling the flow blocked; every probe of a matrix runs in parallel.
const probeTimeout = 300 * time.Millisecond
