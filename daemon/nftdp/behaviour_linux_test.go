package nftdp

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/test/privileged"
)

var serverFromClientsOn80 = policyDoc("server", "default", `  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 80}]
`)

func TestDualStackAndEgress(t *testing.T) {
	c := newCluster(t, true)
	c.policies(policyDoc("client", "default", `  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: server}}}]
    ports: [{port: 80}]
`))
	c.expect(true, "a>b tcp/80", "a>b6 tcp/80", "b>a tcp/80", "c>b tcp/81", "node>a tcp/81")
	c.expect(false, "a>b tcp/81", "a>b6 tcp/81", "a>c tcp/80", "a>ext tcp/80", "a>b udp/80")
}

// TestNamedPorts: a rule naming a container port resolves to the port
// the selected pod declares under that name.
func TestNamedPorts(t *testing.T) {
	c := newCluster(t, false)
	b := c.eps["b"]
	b.Pod = "default/b"
	if err := c.dp.AttachEndpoint(b); err != nil {
		t.Fatal(err)
	}
	c.policies(policyDoc("server", "default", `  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: web}]
`))
	c.expect(false, "a>b tcp/80", "a>b tcp/81")
	if err := c.dp.SetPodNamedPorts("default/b", []policy.NamedPort{{Name: "web", Protocol: policy.ProtoTCP, Port: 81}}); err != nil {
		t.Fatal(err)
	}
	c.expect(true, "a>b tcp/81")
	c.expect(false, "a>b tcp/80", "c>b tcp/81")
}

// TestServiceDecidedOnBackend: an nftables DNAT rule in the node netns
// stands in for kube-proxy (Service 10.96.0.10:8080 to pod b port 80):
// the forward hook sees the translated packet, so ingress policy at the
// backend and egress policy at the client decide on the backend's address
// and port, with no stage of their own.
func TestServiceDecidedOnBackend(t *testing.T) {
	c := newCluster(t, false)
	dnat(t, "10.96.0.10", podIPs["b"].String(), 80)
	svc := func(from string) error {
		return c.pods[from].Probe("tcp", netip.MustParseAddr("10.96.0.10"), 8080)
	}
	if err := svc("c"); err != nil {
		t.Fatalf("no policy: c to the Service: %v", err)
	}
	c.policies(serverFromClientsOn80, policyDoc("client", "default", `  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: server}}}]
    ports: [{port: 80}]
`))
	if err := svc("a"); err != nil {
		t.Errorf("a (client, egress to servers on 80) to the Service: %v", err)
	}
	if err := svc("c"); err == nil {
		t.Errorf("c (other namespace) reached the Service's backend")
	}
	// The Service's own port is not what the rule names.
	c.policies(policyDoc("client", "default", `  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - ports: [{port: 8080}]
`))
	if err := svc("a"); err == nil {
		t.Errorf("a reached the backend on port 80 with egress allowed on 8080 only")
	}
}

// TestNodePortDecidedOnBackend: kube-proxy's DNAT of a node address on a
// NodePort port runs in PREROUTING, before routing: the translated packet
// is forwarded to the backend's veth, so the forward hook's egress chain
// decides on the backend with no deferral of its own (allowing the node
// address does not reach the backend; allowing the backend does). The node
// address on a port nothing translates goes to the input hook and is
// judged on the address.
func TestNodePortDecidedOnBackend(t *testing.T) {
	c := newCluster(t, false)
	node := testnet.NodeIP
	dnatFrom(t, node.String(), 30080, podIPs["b"].String(), 80)
	testnet.ServeNodeTCP(t, "tcp4", netip.AddrPortFrom(node, 30081).String())
	probe := func(allowed bool, port int) {
		t.Helper()
		err := c.pods["a"].Probe("tcp", node, port)
		if allowed && err != nil {
			t.Errorf("a>node tcp/%d: want allowed, got %v", port, err)
		}
		if !allowed && err == nil {
			t.Errorf("a>node tcp/%d: want denied, but it passed", port)
		}
	}
	probe(true, 30080)
	c.policies(policyDoc("client", "default", `  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: server}}}]
    ports: [{port: 80}]
`))
	probe(true, 30080)
	probe(false, 30081)
	c.policies(policyDoc("client", "default", `  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 192.0.2.1/32}}]
`))
	probe(false, 30080)
	probe(true, 30081)
}

// dnat installs a kube-proxy-like DNAT rule (svc:8080 to backend:port)
// in a table of its own, removed at cleanup.
func dnat(t *testing.T, svc, backend string, port int) {
	t.Helper()
	dnatFrom(t, svc, 8080, backend, port)
}

// dnatFrom is dnat from svc:svcPort.
func dnatFrom(t *testing.T, svc string, svcPort int, backend string, port int) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		privileged.Needs(t, "nft (Debian package nftables) for the DNAT rule kube-proxy would write")
	}
	table := fmt.Sprintf("cdotest%x", rand.Uint32())
	rules := fmt.Sprintf(`table ip %[1]s {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr %[2]s tcp dport %[5]d dnat to %[3]s:%[4]d
	}
}`, table, svc, backend, port, svcPort)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "ip", table).Run() })
}

// TestSpoofedSourceDropped: a pod sending from an address not its own is
// dropped, with or without policy, though the node would route the
// replies back to it.
func TestSpoofedSourceDropped(t *testing.T) {
	c := newCluster(t, false)
	spoofed := netip.MustParseAddr("198.51.100.99")
	a := c.pods["a"]
	addPodAddr(t, a, spoofed)
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: a.HostIfIndex, Dst: &net.IPNet{IP: spoofed.AsSlice(), Mask: net.CIDRMask(32, 32)},
		Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
	dialFrom := func(src netip.Addr) error {
		return a.Do(func() error {
			d := net.Dialer{Timeout: testnet.Timeout, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
			conn, err := d.Dial("tcp4", netip.AddrPortFrom(podIPs["b"], 80).String())
			if err != nil {
				return err
			}
			defer conn.Close()
			return testnet.Echo(conn)
		})
	}
	if err := dialFrom(podIPs["a"]); err != nil {
		t.Fatalf("from a's own address: %v", err)
	}
	if err := dialFrom(spoofed); err == nil {
		t.Fatalf("from %s, not a's address: got through", spoofed)
	}
	if drops, err := c.dp.Drops(); err != nil || drops["egress-spoofed"] == 0 || drops["ingress-policy-denied"] != 0 {
		t.Errorf("drops %v (%v), want the spoofed SYNs counted", drops, err)
	}
	// The control: without the datapath the node routes it both ways.
	if err := Remove(); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(spoofed); err != nil {
		t.Fatalf("without the table the spoofed connection should work (the test's routing is wrong): %v", err)
	}
}

// addPodAddr gives pod p's eth0 address a too, which its endpoint does
// not know: sending from it is spoofing.
func addPodAddr(t *testing.T, p *testnet.Pod, a netip.Addr) {
	t.Helper()
	if err := p.Do(func() error {
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(eth0, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}})
	}); err != nil {
		t.Fatal(err)
	}
}

// TestRestartAdoptsTable: a second Open (the daemon restarted) finds the
// endpoints and keeps the policy in force until its first snapshot, which
// then replaces it by difference.
func TestRestartAdoptsTable(t *testing.T) {
	c := newCluster(t, true)
	c.policies(serverFromClientsOn80)
	c.expect(false, "c>b tcp/80", "a>b tcp/81")
	c.dp.Close()
	c.open()
	keys, err := c.dp.Endpoints()
	if err != nil || len(keys) != 3 {
		t.Fatalf("adopted endpoints %v (%v), want the 3 attached", keys, err)
	}
	// Not synced yet: the previous run's policy holds.
	c.expect(true, "a>b tcp/80", "a>b6 tcp/80")
	c.expect(false, "c>b tcp/80", "a>b tcp/81", "ext>b tcp/80")
	before := c.dp.stats.transactions
	c.policies(serverFromClientsOn80)
	c.expect(true, "a>b tcp/80", "a>b6 tcp/80")
	c.expect(false, "c>b tcp/80", "a>b tcp/81")
	if c.dp.stats.transactions != before+1 {
		t.Errorf("first snapshot after restart took %d transactions, want 1", c.dp.stats.transactions-before)
	}
	// Later changes apply as usual, to the adopted endpoints too.
	c.policies()
	c.expect(true, "c>b tcp/80", "a>b tcp/81")
	if err := c.dp.DetachEndpoint(c.eps["b"]); err != nil {
		t.Fatal(err)
	}
	if keys, _ := c.dp.Endpoints(); len(keys) != 2 {
		t.Errorf("after detaching b: %v", keys)
	}
}

// TestFailedTransactionKeepsPolicy: when the kernel refuses a
// transaction, none of it applies (neither more open nor half written),
// and the next update brings everything pending.
func TestFailedTransactionKeepsPolicy(t *testing.T) {
	c := newCluster(t, false)
	c.policies(serverFromClientsOn80)
	testFailTransaction = func() bool { return true }
	t.Cleanup(func() { testFailTransaction = nil })
	open := policyDoc("server", "default", `  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{namespaceSelector: {}}]
`)
	if err := c.dp.UpdatePolicy(snapshotOf(t, open)); err == nil {
		t.Fatal("UpdatePolicy succeeded with the transaction refused")
	}
	c.expect(true, "a>b tcp/80")
	c.expect(false, "c>b tcp/80", "a>b tcp/81")
	if drops, err := c.dp.Drops(); err != nil || drops["ingress-policy-denied"] == 0 {
		t.Errorf("drops %v (%v), want the denied SYNs counted", drops, err)
	}
	testFailTransaction = nil
	c.policies(open)
	c.expect(true, "c>b tcp/80", "a>b tcp/81")
}

// TestRemoveLeavesNoTable: uninstall takes the table away, and nothing
// of it stays in force.
func TestRemoveLeavesNoTable(t *testing.T) {
	c := newCluster(t, false)
	c.policies(serverFromClientsOn80)
	c.expect(false, "c>b tcp/80")
	if err := Remove(); err != nil {
		t.Fatal(err)
	}
	if ok, err := Installed(); ok || err != nil {
		t.Fatalf("Installed after Remove = %v, %v", ok, err)
	}
	c.expect(true, "c>b tcp/80")
}

// TestLargeTransaction: a snapshot of 2,000 rules is one transaction of
// thousands of changes, larger than a netlink socket's default buffers;
// it applies whole.
func TestLargeTransaction(t *testing.T) {
	c := newCluster(t, false)
	start := time.Now()
	c.policies(manyRules(2000)...)
	t.Logf("2,000 rules applied in %s", time.Since(start).Round(time.Millisecond))
	c.expect(true, "a>b tcp/80")
	c.expect(false, "c>b tcp/80", "a>b tcp/81")
	c.policies()
	c.expect(true, "c>b tcp/80")
}

// TestDetachRefusedThenRestart: a detach whose transaction the kernel
// refuses still forgets the endpoint's record, so the next start does not
// adopt it and its first snapshot removes its chains.
func TestDetachRefusedThenRestart(t *testing.T) {
	c := newCluster(t, false)
	testFailTransaction = func() bool { return true }
	t.Cleanup(func() { testFailTransaction = nil })
	if err := c.dp.DetachEndpoint(c.eps["b"]); err == nil {
		t.Fatal("detach succeeded with the transaction refused")
	}
	testFailTransaction = nil
	c.dp.Close()
	c.open()
	if keys, _ := c.dp.Endpoints(); len(keys) != 2 {
		t.Fatalf("adopted %v, want a and c only", keys)
	}
	c.policies()
	c.sweep()
	chains, err := c.dp.conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if strings.HasSuffix(ch.Name, c.pods["b"].HostIfName) {
			t.Errorf("chain %s of the detached endpoint left", ch.Name)
		}
	}
}

// TestRecordsWithoutTableDropped: records are written without fsync, so
// a power loss may tear one; it also takes the table away. A start that
// finds records but no table drops them (the daemon re-attaches its pods
// from its own store) instead of refusing a torn one or adopting
// endpoints whose chains are gone.
func TestRecordsWithoutTableDropped(t *testing.T) {
	c := newCluster(t, false)
	c.dp.Close()
	if err := Remove(); err != nil { // what a reboot does to the table
		t.Fatal(err)
	}
	torn := filepath.Join(c.cfg.StateDir, "0123456789abcdef0123456789abcdef.json")
	if err := os.WriteFile(torn, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c.open()
	if keys, err := c.dp.Endpoints(); err != nil || len(keys) != 0 {
		t.Fatalf("adopted %v (%v) with no table, want none", keys, err)
	}
	if files, _ := os.ReadDir(c.cfg.StateDir); len(files) != 0 {
		t.Errorf("%d records left, want none", len(files))
	}
	// The daemon's reconcile attaches its pods again.
	c.policies(serverFromClientsOn80)
	for _, name := range []string{"a", "b", "c"} {
		if err := c.dp.AttachEndpoint(c.eps[name]); err != nil {
			t.Fatal(err)
		}
	}
	c.expect(true, "a>b tcp/80")
	c.expect(false, "c>b tcp/80")
}

// TestPodIfsRestoredAtStart: a start over a table whose pod-ifs set lacks
// the adopted pods' interfaces (a format 4 table has no such set) puts
// them there, so node isolation's jumps and the allowed-flow rules, which
// look interfaces up in it, see the adopted pods.
func TestPodIfsRestoredAtStart(t *testing.T) {
	c := newCluster(t, true)
	c.dp.Close()
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	set := newLayout().sets[setPodIfs]
	conn.FlushSet(set)
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	c.open()
	elems, err := conn.GetSetElements(set)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, e := range elems {
		have[cString(e.Key)] = true
	}
	for name, ep := range c.eps {
		if !have[ep.HostIfName] {
			t.Errorf("pod %s's interface %s not in %s after the start (have %v)", name, ep.HostIfName, setPodIfs, have)
		}
	}
}
