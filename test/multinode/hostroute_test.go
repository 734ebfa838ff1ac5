package multinode

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/test/harness"
)

// TestHostRouting checks eBPF host routing (--host-routing=bpf, the
// default) per routing mode: pod-to-pod traffic across nodes is redirected
// by the programs (their counters move: on the old datapath nothing is),
// the endpoint's ingress policy still decides on that path (a denied port
// is dropped and counted as policy-denied), and flows the host's conntrack
// translated keep the normal path, so kube-proxy-style DNAT works both for
// a reply arriving at the client's node (a Service address translated
// there) and for a reply leaving the server's node (a node port
// translated to a local pod).
func TestHostRouting(t *testing.T) {
	for _, m := range []mode{direct, vxlan} {
		t.Run(m.name, func(t *testing.T) {
			start := time.Now()
			c := newClusterWith(t, m, 2, benchPolicyArgs(t))
			a, b := c.addPod(c.nodes[0]), c.addPod(c.nodes[1])
			serveName(t, b)
			t.Run("redirected", func(t *testing.T) { checkRedirected(t, c, a, b) })
			if m.routing == "vxlan" {
				t.Run("tunnelled", func(t *testing.T) { checkTunnelled(t, c, a, b) })
			}
			t.Run("policy-on-the-fast-path", func(t *testing.T) { checkFastPathPolicy(t, c, a, b) })
			// A Service address translated on the client's node: b's
			// answers reach node0 by host routing's ingress.
			t.Run("service-dnat-reply", func(t *testing.T) {
				checkDNAT(t, c.nodes[0], a, b, netip.MustParseAddr("10.96.0.10"), 80)
			})
			// A port of node1's address translated to b, local to node1:
			// b's answers leave node1 by host routing's egress.
			t.Run("node-port-dnat-reply", func(t *testing.T) {
				checkDNAT(t, c.nodes[1], a, b, c.nodes[1].address(false), 30080)
			})
			// The same two, each on the addresses and ports of a
			// connection host routing carried a moment before.
			t.Run("service-dnat-reuses-tuple", func(t *testing.T) {
				checkDNATReusesTuple(t, c.nodes[0], a, b, netip.MustParseAddr("10.96.0.11"), 80)
			})
			t.Run("node-port-dnat-reuses-tuple", func(t *testing.T) {
				checkDNATReusesTuple(t, c.nodes[1], a, b, c.nodes[1].address(false), 30081)
			})
			t.Logf("%s: %v", m.name, time.Since(start).Round(time.Millisecond))
		})
	}
}

// hostRouteCounters are a node's host routing counters by slot.
type hostRouteCounters = [bpf.CoordinoHostrouteStatHR_STAT_SLOTS]uint64

// hostRouteStats sums a node's pinned host routing counters.
func hostRouteStats(t *testing.T, n *node) hostRouteCounters {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(n.BPFDir, bpf.CoordinoMapCdoHostrouteStats), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var out hostRouteCounters
	for slot := range out {
		var perCPU []uint64
		if err := m.Lookup(uint32(slot), &perCPU); err != nil {
			t.Fatal(err)
		}
		for _, v := range perCPU {
			out[slot] += v
		}
	}
	return out
}

func statDelta(before, after hostRouteCounters, s bpf.CoordinoHostrouteStat) uint64 {
	return after[s] - before[s]
}

// checkRedirected: a's requests leave node0 and b's answers leave node1 by
// redirect_neigh; each arrives by redirect_peer, in both families.
func checkRedirected(t *testing.T, c *cluster, a, b *pod) {
	before0, before1 := hostRouteStats(t, c.nodes[0]), hostRouteStats(t, c.nodes[1])
	for _, v6 := range []bool{false, true} {
		if err := reach(a.NS, b, v6); err != nil {
			t.Fatalf("pod %s -> pod %s (%v): %v", a.Name, b.Name, b.addr(v6), err)
		}
	}
	after0, after1 := hostRouteStats(t, c.nodes[0]), hostRouteStats(t, c.nodes[1])
	// Two TCP connections: at least SYN, ACK and FIN each way.
	for _, check := range []struct {
		node int
		stat bpf.CoordinoHostrouteStat
		got  uint64
	}{
		{0, bpf.CoordinoHostrouteStatHR_STAT_OUT_REDIRECTED, statDelta(before0, after0, bpf.CoordinoHostrouteStatHR_STAT_OUT_REDIRECTED)},
		{0, bpf.CoordinoHostrouteStatHR_STAT_IN_REDIRECTED, statDelta(before0, after0, bpf.CoordinoHostrouteStatHR_STAT_IN_REDIRECTED)},
		{1, bpf.CoordinoHostrouteStatHR_STAT_OUT_REDIRECTED, statDelta(before1, after1, bpf.CoordinoHostrouteStatHR_STAT_OUT_REDIRECTED)},
		{1, bpf.CoordinoHostrouteStatHR_STAT_IN_REDIRECTED, statDelta(before1, after1, bpf.CoordinoHostrouteStatHR_STAT_IN_REDIRECTED)},
	} {
		if check.got < 6 {
			t.Errorf("node%d: host routing counter %d moved by %d packets, want >= 6 (not host-routed)", check.node, check.stat, check.got)
		}
	}
}

// checkTunnelled: over an IPv4 underlay in vxlan routing, host-routed
// packets are encapsulated and decapsulated by the eBPF tunnel on both
// nodes, in both families, not by the VXLAN device.
func checkTunnelled(t *testing.T, c *cluster, a, b *pod) {
	before := []hostRouteCounters{hostRouteStats(t, c.nodes[0]), hostRouteStats(t, c.nodes[1])}
	for _, v6 := range []bool{false, true} {
		if err := reach(a.NS, b, v6); err != nil {
			t.Fatalf("pod %s -> pod %s (%v): %v", a.Name, b.Name, b.addr(v6), err)
		}
	}
	for i, n := range c.nodes {
		after := hostRouteStats(t, n)
		for _, stat := range []bpf.CoordinoHostrouteStat{bpf.CoordinoHostrouteStatHR_STAT_ENCAPSULATED, bpf.CoordinoHostrouteStatHR_STAT_DECAPSULATED} {
			if got := statDelta(before[i], after, stat); got < 6 {
				t.Errorf("%s: tunnel counter %d moved by %d packets, want >= 6 (the VXLAN device carried them)", n.Name, stat, got)
			}
		}
	}
}

// checkFastPathPolicy isolates b for ingress with only namePort allowed
// from the pod blocks: namePort still answers, another port is dropped by
// the policy run on node1's uplink and counted like on the normal path.
func checkFastPathPolicy(t *testing.T, c *cluster, a, b *pod) {
	stop, err := harness.Serve(b.NS, b.addr(false), echoPort, b.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	pol := []byte(fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-name-port, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
  - from:
    - ipBlock: {cidr: 10.10.0.0/16}
    - ipBlock: {cidr: "fd00:10::/32"}
    ports:
    - {protocol: TCP, port: %d}
`, namePort))
	dir := filepath.Join(c.nodes[1].Dir, "policies")
	if err := c.nodes[1].WritePolicy(dir, "hostroute.yaml", pol, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.nodes[1].WritePolicy(dir, "hostroute.yaml", nil, 30*time.Second); err != nil {
			t.Error(err)
		}
	}()
	denied := func() float64 {
		v, err := c.nodes[1].Metric("coordino_datapath_packets_total", `direction="ingress"`, `reason="policy-denied"`)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	before, stats := denied(), hostRouteStats(t, c.nodes[1])
	if err := reach(a.NS, b, false); err != nil {
		t.Fatalf("allowed port: %v", err)
	}
	if got, err := harness.DialFrom(a.NS, "tcp", b.addr(false), echoPort, 500*time.Millisecond); err == nil {
		got.Close()
		t.Fatalf("%s reached %s on port %d, which no policy allows", a.Name, b.Name, echoPort)
	}
	if d := denied() - before; d < 1 {
		t.Errorf("policy-denied ingress packets on node1 moved by %v, want >= 1", d)
	}
	if d := statDelta(stats, hostRouteStats(t, c.nodes[1]), bpf.CoordinoHostrouteStatHR_STAT_IN_REDIRECTED); d == 0 {
		t.Error("the allowed connection was not host-routed into the pod")
	}
}

// checkDNAT translates addr:port on n, as kube-proxy does, to b's name
// server, and dials it from a: b's answers cross a node whose host routing
// must leave them to the host for the reverse translation, counted as
// host-tracked there.
func checkDNAT(t *testing.T, n *node, a, b *pod, addr netip.Addr, port uint16) {
	addDNAT(t, n, addr, port, b.addr(false), namePort)
	before := hostRouteStats(t, n)
	got, err := dialPort(a.NS, addr, int(port), 3*time.Second)
	if err != nil || got != b.Name {
		t.Fatalf("pod %s -> %v:%d (DNAT on %s to %s): answered %q, %v", a.Name, addr, port, n.Name, b.Name, got, err)
	}
	if d := statDelta(before, hostRouteStats(t, n), bpf.CoordinoHostrouteStatHR_STAT_HOST_TRACKED); d == 0 {
		t.Errorf("%s's host routing did not see the host-tracked reply", n.Name)
	}
}

// reuseEchoPort is the echo server checkDNATReusesTuple translates to.
const reuseEchoPort = echoPort + 2

// checkDNATReusesTuple: a talks to b's echo server straight, host-routed
// both ways, then from the same port to addr:port, which n translates to
// the same echo server. On the wire both connections have the same
// addresses and ports; the second's answers must still meet the host's
// reverse translation on n, though host routing found the first unknown to
// the host's conntrack a moment before and remembers that per CPU: the new
// connection's SYN must make every CPU forget it. So n host-routes none of
// the second connection's packets. Several rounds, so that the answers
// land on a CPU that carried the first connection.
func checkDNATReusesTuple(t *testing.T, n *node, a, b *pod, addr netip.Addr, port uint16) {
	const echoes = 20
	stop, err := harness.ServeTCPEcho(b.NS, b.addr(false), reuseEchoPort)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	addDNAT(t, n, addr, port, b.addr(false), reuseEchoPort)
	redirected := func(before, after hostRouteCounters) uint64 {
		return statDelta(before, after, bpf.CoordinoHostrouteStatHR_STAT_IN_REDIRECTED) +
			statDelta(before, after, bpf.CoordinoHostrouteStatHR_STAT_OUT_REDIRECTED)
	}
	tracked := hostRouteStats(t, n)
	for round := 0; round < 5; round++ {
		local := 10000 + rand.IntN(20000) // below the ephemeral ports
		before := hostRouteStats(t, n)
		if err := echoFromPort(a, local, b.addr(false), reuseEchoPort, echoes); err != nil {
			t.Fatalf("round %d: %s:%d -> %s straight: %v", round, a.Name, local, b.Name, err)
		}
		straight := hostRouteStats(t, n)
		if d := redirected(before, straight); d < echoes {
			t.Fatalf("round %d: %s host-routed %d packets of the straight connection, want >= %d", round, n.Name, d, echoes)
		}
		// The straight connection's last packets (the answer to b's FIN)
		// may still be leaving a: count from when a is quiet.
		sent, judged := quietCounts(t, a)
		if err := echoFromPort(a, local, addr, int(port), echoes); err != nil {
			t.Fatalf("round %d: %s:%d -> %v:%d (DNAT on %s to %s), after a connection on the same tuple: %v",
				round, a.Name, local, addr, port, n.Name, b.Name, err)
		}
		// Answered from the memo but not host-routed (to the
		// translated address), each packet is still judged once.
		s, j := quietCounts(t, a)
		s, j = s-sent, j-judged
		if j != s {
			t.Errorf("round %d: %s sent %d packets, %s counted %d egress verdicts", round, a.Name, s, a.node.Name, j)
		}
		if d := redirected(straight, hostRouteStats(t, n)); d != 0 {
			t.Errorf("round %d: %s host-routed %d packets of the translated connection past its reverse translation", round, n.Name, d)
		}
	}
	if d := statDelta(tracked, hostRouteStats(t, n), bpf.CoordinoHostrouteStatHR_STAT_HOST_TRACKED); d == 0 {
		t.Errorf("%s's host routing did not see the host-tracked answers", n.Name)
	}
}

// quietCounts reads the packets p has sent and the egress verdicts its node
// has counted once neither moved between two reads a pause apart: every
// packet p sent has been judged by then, so the two count the same packets.
// The node's verdicts are p's only while p is its only pod.
func quietCounts(t *testing.T, p *pod) (sent, judged uint64) {
	t.Helper()
	if len(p.node.pods) != 1 {
		t.Fatalf("%s has %d pods: its egress verdicts are not %s's alone", p.node.Name, len(p.node.pods), p.Name)
	}
	// No reading yet: the first attempt only reads, so the two reads
	// that agree are one of eventually's pauses apart.
	sent, judged = math.MaxUint64, math.MaxUint64
	if err := eventually(5*time.Second, func() error {
		s, j := podSent(t, p), egressJudged(t, p.node)
		if s == sent && j == judged {
			return nil
		}
		sent, judged = s, j
		return fmt.Errorf("%s kept sending (or %s kept judging)", p.Name, p.node.Name)
	}); err != nil {
		t.Fatal(err)
	}
	return sent, judged
}

// podSent is the number of packets p has sent from eth0.
func podSent(t *testing.T, p *pod) uint64 {
	t.Helper()
	var sent uint64
	if err := p.NS.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		sent = link.Attrs().Statistics.TxPackets
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return sent
}

// egressJudged is the number of egress verdicts n's datapath has counted.
func egressJudged(t *testing.T, n *node) uint64 {
	t.Helper()
	v, err := n.Metric("coordino_datapath_packets_total", `direction="egress"`)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(v)
}

// echoFromPort connects from p's local port (SO_REUSEADDR: the previous
// connection from it may be in TIME_WAIT) to addr:port and exchanges n
// one-byte echoes.
func echoFromPort(p *pod, local int, addr netip.Addr, port, n int) error {
	return p.NS.Do(func(ns.NetNS) error {
		d := net.Dialer{
			Timeout:   3 * time.Second,
			LocalAddr: &net.TCPAddr{IP: p.addr(false).AsSlice(), Port: local},
			Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				if err := rc.Control(func(fd uintptr) {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
				}); err != nil {
					return err
				}
				return serr
			},
		}
		conn, err := d.Dial("tcp", netip.AddrPortFrom(addr, uint16(port)).String())
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		b := []byte{0}
		for i := 0; i < n; i++ {
			b[0] = byte(i)
			if _, err := conn.Write(b); err != nil {
				return fmt.Errorf("echo %d: %w", i, err)
			}
			if _, err := io.ReadFull(conn, b); err != nil || b[0] != byte(i) {
				return fmt.Errorf("echo %d: got %v, %v", i, b, err)
			}
		}
		// Closed on both sides before the next connection reuses the
		// tuple: a server still holding this one would answer that
		// connection's SYN with an ACK of this one.
		if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
			return err
		}
		if rest, err := io.ReadAll(conn); err != nil || len(rest) > 0 {
			return fmt.Errorf("close: read %d more bytes, %v", len(rest), err)
		}
		return nil
	})
}

// serveName serves p's name on namePort over both families until the test ends.
func serveName(t *testing.T, p *pod) {
	t.Helper()
	for _, v6 := range []bool{false, true} {
		stop, err := harness.Serve(p.NS, p.addr(v6), namePort, p.Name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
}

// addDNAT adds an nftables rule in n's namespace translating TCP to
// from:fromPort into to:toPort, removed at cleanup.
func addDNAT(t *testing.T, n *node, from netip.Addr, fromPort uint16, to netip.Addr, toPort uint16) {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(int(n.NS.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	table := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "hostroute-test-" + harness.RandomSuffix(6)})
	chain := conn.AddChain(&nftables.Chain{
		Name: "prerouting", Table: table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest,
	})
	conn.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: from.AsSlice()},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(fromPort)},
		&expr.Immediate{Register: 1, Data: to.AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(toPort)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2},
	}})
	if err := conn.Flush(); err != nil {
		t.Fatalf("%s: add DNAT rule: %v", n.Name, err)
	}
	t.Cleanup(func() {
		conn.DelTable(table)
		if err := conn.Flush(); err != nil {
			t.Errorf("%s: remove DNAT rule: %v", n.Name, err)
		}
	})
}

// TestHostRoutingLegacy: with --host-routing=legacy pods still reach each
// other across nodes, and nothing is redirected.
func TestHostRoutingLegacy(t *testing.T) {
	c := newClusterWith(t, direct, 2, func(string) []string { return []string{"--host-routing", "legacy"} })
	a, b := c.addPod(c.nodes[0]), c.addPod(c.nodes[1])
	serveName(t, b)
	for _, v6 := range []bool{false, true} {
		if err := reach(a.NS, b, v6); err != nil {
			t.Fatalf("pod %s -> pod %s (%v): %v", a.Name, b.Name, b.addr(v6), err)
		}
	}
	for _, n := range c.nodes {
		s := hostRouteStats(t, n)
		if in, out := s[bpf.CoordinoHostrouteStatHR_STAT_IN_REDIRECTED], s[bpf.CoordinoHostrouteStatHR_STAT_OUT_REDIRECTED]; in+out != 0 {
			t.Errorf("%s: %d packets redirected in, %d out under --host-routing=legacy", n.Name, in, out)
		}
	}
}
