package datapath

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/test/privileged"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"
)

func TestMain(m *testing.M) { testnet.Main(m) }

var modes = []struct {
	name   string
	attach AttachMode
}{{"tcx", AttachTCX}, {"tc", AttachTC}}

// cluster is a node with pods "a" (app=client), "b" (app=server), both in
// namespace default, "c" (app=client) in namespace other, and "ext", an
// unattached host standing in for the world.
type cluster struct {
	t    testing.TB
	dual bool // pods also get their podIPs6 address
	cfg  Config
	dp   *Datapath
	pods map[string]*testnet.Pod
	eps  map[string]Endpoint
}

var podIPs = map[string]netip.Addr{
	"a": netip.MustParseAddr("198.51.100.10"), "b": netip.MustParseAddr("198.51.100.11"),
	"c": netip.MustParseAddr("198.51.100.12"), "d": netip.MustParseAddr("198.51.100.13"),
	"ext": netip.MustParseAddr("203.0.113.10"),
}

func newCluster(t testing.TB, attach AttachMode) *cluster {
	t.Helper()
	return newClusterWith(t, Config{AttachMode: attach}, false)
}

// newClusterWith builds the cluster with cfg (BPF dir, logger and node
// addresses filled in); dual gives every pod an IPv6 address too.
func newClusterWith(t testing.TB, cfg Config, dual bool) *cluster {
	t.Helper()
	privileged.Require(t)
	c := &cluster{t: t, dual: dual, pods: map[string]*testnet.Pod{}, eps: map[string]Endpoint{}}
	cfg.BPFDir, cfg.Logger = testnet.BPFDir(t), zaptest.NewLogger(t)
	cfg.NodeIPs = []netip.Addr{testnet.NodeIP, testnet.NodeIP6}
	c.cfg = cfg
	c.open()
	if err := c.dp.UpdatePolicy(policy.Snapshot{}); err != nil {
		t.Fatal(err)
	}
	c.pods["ext"] = testnet.NewPod(t, "ext", podIPs["ext"], c.extraIPs("ext")...)
	c.addPod("a", "default", map[string]string{"app": "client"})
	c.addPod("b", "default", map[string]string{"app": "server"})
	c.addPod("c", "other", map[string]string{"app": "client"})
	return c
}

var podIPs6 = map[string]netip.Addr{
	"a": netip.MustParseAddr("2001:db8:1::10"), "b": netip.MustParseAddr("2001:db8:1::11"),
	"c": netip.MustParseAddr("2001:db8:1::12"), "d": netip.MustParseAddr("2001:db8:1::13"),
	"ext": netip.MustParseAddr("2001:db8:2::10"),
}

func (c *cluster) extraIPs(name string) []netip.Addr {
	if c.dual {
		return []netip.Addr{podIPs6[name]}
	}
	return nil
}

func (c *cluster) open() {
	c.t.Helper()
	dp, err := Open(c.cfg)
	if err != nil {
		c.t.Fatalf("Open: %v", err)
	}
	c.dp = dp
	c.t.Cleanup(func() { dp.Close() })
}

func (c *cluster) addPod(name, ns string, labels map[string]string) {
	c.t.Helper()
	p := testnet.NewPod(c.t, name, podIPs[name], c.extraIPs(name)...)
	c.pods[name] = p
	ep := Endpoint{Key: "net/" + name + "-" + filepath.Base(c.t.Name()) + "/eth0", HostIfName: p.HostIfName,
		HostIfIndex: p.HostIfIndex, IPs: p.IPs, Namespace: ns, Labels: labels}
	if err := c.dp.AttachEndpoint(ep); err != nil {
		c.t.Fatalf("attach %s: %v", name, err)
	}
	c.eps[name] = ep
}

func (c *cluster) policies(docs ...string) {
	c.t.Helper()
	if err := c.tryPolicies(docs...); err != nil {
		c.t.Fatalf("UpdatePolicy: %v", err)
	}
}

// tryPolicies applies docs (NetworkPolicies, ClusterNetworkPolicies and
// Nodes) as the whole policy snapshot.
func (c *cluster) tryPolicies(docs ...string) error {
	c.t.Helper()
	s := policy.Snapshot{}
	for _, d := range docs {
		if strings.HasPrefix(strings.TrimSpace(d), "kind: Node\n") {
			n := &corev1.Node{}
			if err := yaml.UnmarshalStrict([]byte(d), n); err != nil {
				c.t.Fatalf("bad node: %v", err)
			}
			s.Nodes = append(s.Nodes, n)
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(d), "kind: ClusterNetworkPolicy") {
			cnp := &cnpv1beta1.ClusterNetworkPolicy{}
			if err := yaml.UnmarshalStrict([]byte(d), cnp); err != nil {
				c.t.Fatalf("bad cluster policy: %v", err)
			}
			s.ClusterPolicies = append(s.ClusterPolicies, cnp)
			continue
		}
		np := &networkingv1.NetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(d), np); err != nil {
			c.t.Fatalf("bad policy: %v", err)
		}
		s.Policies = append(s.Policies, np)
	}
	return c.dp.UpdatePolicy(s)
}

// expect checks "from>to proto/port" probes; from "node" probes from the node.
func (c *cluster) expect(allowed bool, checks ...string) {
	c.t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(checks))
	for i, check := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var from, to, proto string
			var port int
			if _, err := fmt.Sscanf(strings.NewReplacer(">", " ", "/", " ").Replace(check), "%s %s %s %d", &from, &to, &proto, &port); err != nil {
				errs[i] = err
				return
			}
			dst := c.pods[to].IP
			probe := func() error {
				if from == "node" {
					return testnet.ProbeFromNode(proto, dst, port)
				}
				return c.pods[from].Probe(proto, dst, port)
			}
			errs[i] = probe()
			// A probe's deadline is short so that denied ones are quick to
			// tell; in an emulated guest (slowed down) an allowed exchange
			// may outlast it, so there it gets more tries. The host's one
			// try keeps a first packet lost to a race a failure.
			for try := 1; allowed && errs[i] != nil && try < slowedTries; try++ {
				errs[i] = probe()
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if allowed && err != nil {
			c.t.Errorf("%s: want allowed, got %v", checks[i], err)
		}
		if !allowed && err == nil {
			c.t.Errorf("%s: want denied, but it passed", checks[i])
		}
	}
}

// slowedTries is how often an allowed probe is tried: once natively, once
// per unit of privileged.Slowdown in guests.
var slowedTries = int(privileged.Slowdown(time.Second) / time.Second)

const (
	serverIngress = `
metadata: {name: server-ingress, namespace: default}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 80}]`
	clientEgress = `
metadata: {name: client-egress, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: server}}}]
    ports: [{protocol: UDP, port: 81}, {protocol: TCP, port: 80}]
  - to: [{ipBlock: {cidr: 203.0.113.0/24, except: [203.0.113.128/25]}}]
    ports: [{port: 80}]`
	denyServerIngress = `
metadata: {name: deny-server, namespace: default}
spec: {podSelector: {matchLabels: {app: server}}, policyTypes: [Ingress]}`
)

func TestPolicyEnforcement(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			c := newCluster(t, m.attach)
			assertAttached(t, c, m.attach == AttachTC || !kernelHasTCX())

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			flows := make(chan Flow, 1024)
			go func() { _ = c.dp.ReadFlows(ctx, func(f Flow) { flows <- f }) }()

			// No policy: everything flows.
			c.expect(true, "a>b tcp/80", "a>b udp/81", "c>b tcp/81", "ext>b tcp/80", "b>a udp/80")

			c.policies(serverIngress, clientEgress)
			c.expect(true,
				"a>b tcp/80",    // server ingress + client egress allow
				"node>b tcp/81", // the node is always allowed in
				"node>a udp/80", // also to a pod isolated only for egress
				"b>a tcp/80",    // server egress is not isolated, client ingress neither
				"a>ext tcp/80",  // ipBlock egress
			)
			c.expect(false,
				"a>b tcp/81",   // port not allowed at server
				"a>b udp/80",   // protocol not allowed
				"a>b udp/81",   // allowed egress, but server ingress only allows TCP 80
				"ext>b tcp/80", // world denied at server
				"a>ext tcp/81", // ipBlock rule is port 80 only
				"a>c tcp/80",   // client egress does not allow c
				"c>b tcp/80",   // a podSelector peer only selects the policy namespace
			)

			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(c.dp.Collectors()...)
			got, err := testutil.GatherAndCount(reg, "coordino_datapath_packets_total")
			if err != nil || got == 0 {
				t.Fatalf("packet counters: %d series, %v", got, err)
			}
			if v := counterValue(t, reg, "coordino_datapath_packets_total", "policy-denied"); v == 0 {
				t.Error("no policy-denied packets counted")
			}
			if v := counterValue(t, reg, "coordino_datapath_packets_total", "host"); v == 0 {
				t.Error("no host-allowed packets counted")
			}

			// A denied flow is reported with its endpoint, reason and ports.
			deadline := time.After(3 * time.Second)
			for found := false; !found; {
				select {
				case f := <-flows:
					found = f.Verdict == "dropped" && f.Reason == "policy-denied" && f.Src == podIPs["ext"] &&
						f.Dst == podIPs["b"] && f.DstPort == 80 && f.Protocol == "TCP" &&
						f.Direction == "ingress" && f.Endpoint == c.eps["b"].Key
				case <-deadline:
					t.Fatal("no flow event for the denied ext>b tcp/80")
				}
			}
		})
	}
}

// TestCrossNamespaceSelectors: c in namespace "other" reaches b only when a
// namespaceSelector allows it.
func TestCrossNamespaceSelectors(t *testing.T) {
	c := newCluster(t, AttachTC)
	c.policies(serverIngress)
	c.expect(false, "c>b tcp/80")
	c.policies(serverIngress, `
metadata: {name: from-other, namespace: default}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: other}}, podSelector: {matchLabels: {app: client}}}]}]`)
	c.expect(true, "c>b tcp/80", "c>b udp/81")
	c.expect(false, "ext>b tcp/80")
}

// An upgrade removes the pins of maps earlier versions used, such as the
// flow memo's old layout, which an older program would misread.
func TestOpenRemovesRetiredPins(t *testing.T) {
	privileged.Require(t)
	dir := testnet.BPFDir(t)
	retired := []string{"cdo_counters", "cdo_ct_memo"}
	for _, name := range retired {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Pin(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	dp, err := Open(Config{BPFDir: dir, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	for _, name := range retired {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("retired pin %s still there after Open: %v", name, err)
		}
	}
}

func TestRestartAdoption(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			c := newCluster(t, m.attach)
			c.policies(serverIngress)
			conn, err := c.pods["a"].Dial(c.pods["b"].IP, 80)
			if err != nil {
				t.Fatalf("dial a>b: %v", err)
			}
			defer conn.Close()
			if err := testnet.Echo(conn); err != nil {
				t.Fatal(err)
			}
			before, _ := c.dp.Endpoints()
			idBefore := c.dp.eps.get(c.eps["b"].Key).Identity

			// Daemon gone: pinned links keep enforcing.
			if err := c.dp.Close(); err != nil {
				t.Fatal(err)
			}
			if err := testnet.Echo(conn); err != nil {
				t.Fatalf("established flow broke while the daemon was down: %v", err)
			}
			c.expect(true, "a>b tcp/80")
			c.expect(false, "a>b tcp/81", "ext>b tcp/80")

			// Daemon back: adopts everything without a gap.
			c.open()
			after, _ := c.dp.Endpoints()
			if strings.Join(before, ",") != strings.Join(after, ",") {
				t.Fatalf("endpoints after restart %v, want %v", after, before)
			}
			if id := c.dp.eps.get(c.eps["b"].Key).Identity; id != idBefore {
				t.Fatalf("identity changed across restart: %d -> %d", idBefore, id)
			}
			if err := testnet.Echo(conn); err != nil {
				t.Fatalf("established flow broke after restart: %v", err)
			}
			c.expect(false, "ext>b tcp/80")
			// Attach before the first snapshot is refused, not unprotected.
			if err := c.dp.AttachEndpoint(c.eps["a"]); err != ErrPolicyNotSynced {
				t.Fatalf("attach before sync = %v, want ErrPolicyNotSynced", err)
			}
			c.policies(serverIngress)
			// Re-attaching adopted endpoints (reconciliation) is idempotent.
			for _, name := range []string{"a", "b", "c"} {
				if err := c.dp.AttachEndpoint(c.eps[name]); err != nil {
					t.Fatalf("re-attach %s: %v", name, err)
				}
			}
			if err := testnet.Echo(conn); err != nil {
				t.Fatalf("established flow broke after resync: %v", err)
			}
			c.expect(true, "a>b tcp/80", "node>b tcp/81")
			c.expect(false, "a>b tcp/81", "ext>b tcp/80")
			assertAttached(t, c, m.attach == AttachTC || !kernelHasTCX())
		})
	}
}

func TestPolicyUpdateRevokesEstablishedFlows(t *testing.T) {
	c := newCluster(t, AttachTC)
	c.policies(serverIngress)
	conn, err := c.pods["a"].Dial(c.pods["b"].IP, 80)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := testnet.Echo(conn); err != nil {
		t.Fatal(err)
	}
	c.policies(denyServerIngress)
	if err := testnet.Echo(conn); err == nil {
		t.Fatal("established flow still passes after its policy was removed")
	}
	c.expect(false, "a>b tcp/80")
	c.policies(serverIngress)
	c.expect(true, "a>b tcp/80")
}

// TestPolicyUpdateRevokesUDPFlowOfIsolatedServer: a UDP flow opened while
// the server's ingress was already isolated (by a policy allowing the
// client) is cut when a new policy denies the client, and a new flow from
// the same port is denied too, although the server's egress stays open.
// Fails where the flow's entry was marked ambiguous (either side may have
// opened it): it then survived every revocation, and a client reusing a
// port of an earlier allowed flow got through for minutes. The same holds
// for an entry an older version marked ambiguous, adopted at an upgrade.
func TestPolicyUpdateRevokesUDPFlowOfIsolatedServer(t *testing.T) {
	for _, marked := range []bool{false, true} {
		t.Run(map[bool]string{false: "opened", true: "marked-by-older-version"}[marked], func(t *testing.T) {
			c := newCluster(t, AttachTC)
			const udpIngress = `
metadata: {name: server-udp, namespace: default}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{protocol: UDP, port: 80}]`
			c.policies(udpIngress)
			client := netip.AddrPortFrom(c.pods["a"].IP, 40123)
			server := netip.AddrPortFrom(c.pods["b"].IP, 80)
			var conn *net.UDPConn
			dial := func() {
				t.Helper()
				if conn != nil {
					conn.Close()
				}
				if err := c.pods["a"].Do(func() (err error) {
					conn, err = net.DialUDP("udp4", net.UDPAddrFromAddrPort(client), net.UDPAddrFromAddrPort(server))
					return err
				}); err != nil {
					t.Fatal(err)
				}
			}
			dial()
			defer func() { conn.Close() }()
			if err := testnet.Echo(conn); err != nil {
				t.Fatalf("allowed UDP flow: %v", err)
			}
			if marked {
				markUDPAmbiguous(t, c, client.Port())
			}
			c.policies(denyServerIngress)
			if err := testnet.Echo(conn); err == nil {
				t.Fatal("UDP flow still passes after its policy was removed")
			}
			dial() // a new socket on the same ports: a new flow to policy
			if err := testnet.Echo(conn); err == nil {
				t.Fatal("a new UDP flow on the ports of a revoked one passes")
			}
			c.policies(udpIngress)
			if err := testnet.Echo(conn); err != nil {
				t.Fatalf("UDP flow allowed again: %v", err)
			}
		})
	}
}

// ctAmbiguous is CT_AMBIGUOUS of bpf/coordino.h.
const ctAmbiguous = 8

// markUDPAmbiguous sets CT_AMBIGUOUS on the entries of the UDP flows from
// or to port, as versions that marked UDP entries so left them.
func markUDPAmbiguous(t *testing.T, c *cluster, port uint16) {
	t.Helper()
	var (
		k bpf.CoordinoCtKey
		v bpf.CoordinoCtEntry
	)
	marked := map[bpf.CoordinoCtKey]bpf.CoordinoCtEntry{}
	it := c.dp.objs.CdoConntrack.Iterate()
	for it.Next(&k, &v) {
		if k.Proto == 17 /* UDP */ && (ntohs(k.Sport) == port || ntohs(k.Dport) == port) {
			v.Flags |= ctAmbiguous
			marked[k] = v
		}
	}
	if len(marked) == 0 {
		t.Fatalf("no conntrack entry of the UDP flow on port %d", port)
	}
	for k, v := range marked {
		if err := c.dp.objs.CdoConntrack.Update(&k, &v, ebpf.UpdateExist); err != nil {
			t.Fatal(err)
		}
	}
}

func TestNewEndpointDeniedFromFirstPacket(t *testing.T) {
	c := newCluster(t, AttachTC)
	c.policies(denyServerIngress)
	c.addPod("d", "default", map[string]string{"app": "server"})
	// AttachEndpoint has returned: the very first packets must already be policed.
	c.expect(false, "a>d tcp/80", "a>d udp/80", "ext>d tcp/81")
	c.expect(true, "node>d tcp/80", "d>a tcp/80")
}

func TestDetachRemovesAttachmentAndEntries(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			c := newCluster(t, m.attach)
			c.policies(denyServerIngress)
			c.expect(false, "a>b tcp/80")
			ep := c.eps["b"]
			if err := c.dp.DetachEndpoint(ep); err != nil {
				t.Fatal(err)
			}
			if err := c.dp.DetachEndpoint(ep); err != nil {
				t.Fatalf("second detach: %v", err)
			}
			c.expect(true, "a>b tcp/80")
			keys, _ := c.dp.Endpoints()
			for _, k := range keys {
				if k == ep.Key {
					t.Fatal("detached endpoint still listed")
				}
			}
			var info struct{ Identity, Flags uint32 }
			if err := c.dp.objs.CdoEndpoints.Lookup(uint32(ep.HostIfIndex), &info); err == nil {
				t.Fatal("endpoint map entry left behind")
			}
			for _, ip := range ep.IPs {
				k := epAddrKey(ep.HostIfIndex, ip)
				var v uint32
				if err := c.dp.objs.CdoEpAddrs.Lookup(&k, &v); err == nil {
					t.Fatalf("source address %s left behind", ip)
				}
			}
			if _, err := os.Stat(c.dp.att.linkDir(ep.Key)); !os.IsNotExist(err) {
				t.Fatalf("link pins left behind: %v", err)
			}
			if n := hookPrograms(t, ep.HostIfIndex); n != 0 {
				t.Fatalf("%d programs still attached", n)
			}
		})
	}
}

// kernelHasTCX probes, once, whether this kernel attaches tcx links (6.6+):
// without them AttachTCX falls back to clsact + cls_bpf, and the tests
// expect that fallback.
var kernelHasTCX = sync.OnceValue(func() bool {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		return false
	}
	defer prog.Close()
	// Loopback of the test's own netns (testnet.Main) is ifindex 1.
	l, err := link.AttachTCX(link.TCXOptions{Program: prog, Attach: ebpf.AttachTCXIngress, Interface: 1})
	if err != nil {
		return false
	}
	l.Close()
	return true
})

// assertAttached checks in the kernel that both hooks of every endpoint run
// Coordino's programs through the expected mechanism.
func assertAttached(t *testing.T, c *cluster, legacy bool) {
	t.Helper()
	for name, ep := range c.eps {
		l, _ := netlink.LinkByIndex(ep.HostIfIndex)
		filters := 0
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			fs, _ := netlink.FilterList(l, parent)
			for _, f := range fs {
				if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, "cdo_") {
					filters++
				}
			}
		}
		tcx := 0
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			if r, err := link.QueryPrograms(link.QueryOptions{Target: ep.HostIfIndex, Attach: at}); err == nil {
				tcx += len(r.Programs)
			}
		}
		if legacy && (filters != 2 || tcx != 0) {
			t.Errorf("%s: %d cls_bpf filters and %d tcx programs, want 2 and 0", name, filters, tcx)
		}
		if !legacy && (filters != 0 || tcx != 2) {
			t.Errorf("%s: %d cls_bpf filters and %d tcx programs, want 0 and 2", name, filters, tcx)
		}
	}
}

func hookPrograms(t *testing.T, ifindex int) int {
	n := 0
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		if r, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at}); err == nil {
			n += len(r.Programs)
		}
	}
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return n
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, _ := netlink.FilterList(l, parent)
		n += len(fs)
	}
	return n
}

func counterValue(t *testing.T, reg *prometheus.Registry, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "reason" && l.GetValue() == reason {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
