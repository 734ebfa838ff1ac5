package datapath

import (
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/policy"
)

// Map-full behaviour with shrunken maps. The cluster holds pods a, b, c
// (three endpoints, three source addresses) and the node's two addresses.

// attachNew attaches a new pod name with ips and returns the error.
func (c *cluster) attachNew(name string, ips ...netip.Addr) (Endpoint, error) {
	c.t.Helper()
	p := testnet.NewPod(c.t, name, ips[0], ips[1:]...)
	c.pods[name] = p
	ep := Endpoint{Key: "net/" + name + "-" + filepath.Base(c.t.Name()) + "/eth0", HostIfName: p.HostIfName,
		HostIfIndex: p.HostIfIndex, IPs: p.IPs, Namespace: "default", Labels: map[string]string{"app": name}}
	return ep, c.dp.AttachEndpoint(ep)
}

func (c *cluster) refusals(name string) float64 {
	return testutil.ToFloat64(c.dp.health.failures.WithLabelValues(name, refusedFull))
}

func (c *cluster) usage(name string) MapUsage {
	c.t.Helper()
	us, err := c.dp.MapUsage()
	if err != nil {
		c.t.Fatal(err)
	}
	for _, u := range us {
		if u.Name == name {
			return u
		}
	}
	c.t.Fatalf("no usage of %s", name)
	return MapUsage{}
}

// assertNothingOf checks that no map holds anything of ep.
func (c *cluster) assertNothingOf(ep Endpoint) {
	c.t.Helper()
	keys, _ := c.dp.Endpoints()
	for _, k := range keys {
		if k == ep.Key {
			c.t.Errorf("endpoint record of %s left", ep.Key)
		}
	}
	var info bpf.CoordinoEndpointInfo
	if err := c.dp.objs.CdoEndpoints.Lookup(uint32(ep.HostIfIndex), &info); !errors.Is(err, ebpf.ErrKeyNotExist) {
		c.t.Errorf("endpoints map entry of %s left (%v)", ep.Key, err)
	}
	for _, ip := range ep.IPs {
		k := epAddrKey(ep.HostIfIndex, ip)
		var v uint32
		if err := c.dp.objs.CdoEpAddrs.Lookup(&k, &v); !errors.Is(err, ebpf.ErrKeyNotExist) {
			c.t.Errorf("source address %s of %s left (%v)", ip, ep.Key, err)
		}
		ik := ipcacheKey(netip.PrefixFrom(ip, ip.BitLen()))
		var iv bpf.CoordinoIpcacheValue
		if err := c.dp.objs.CdoIpcache.Lookup(&ik, &iv); !errors.Is(err, ebpf.ErrKeyNotExist) {
			c.t.Errorf("ipcache entry %s of %s left (%v)", ip, ep.Key, err)
		}
	}
}

// TestEndpointsMapFull: with room for four endpoints, the fifth attach
// fails with a MapFullError naming the map, leaves nothing behind, is
// counted and shown; once an endpoint leaves, the attach goes through.
func TestEndpointsMapFull(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, MapSizes: MapSizes{Endpoints: 4}}, false)
	if _, err := c.attachNew("d", podIPs["d"]); err != nil {
		t.Fatalf("fourth endpoint: %v", err)
	}
	ep, err := c.attachNew("e", netip.MustParseAddr("198.51.100.14"))
	var full *MapFullError
	if !errors.As(err, &full) || full.Map != bpf.CoordinoMapCdoEndpoints || full.Capacity != 4 {
		t.Fatalf("fifth endpoint: got %v, want a MapFullError of cdo_endpoints", err)
	}
	if got := full.Error(); got != "BPF map cdo_endpoints is full (capacity 4): raise --endpoints-map-size" {
		t.Errorf("message %q", got)
	}
	c.assertNothingOf(ep)
	if n := c.refusals(bpf.CoordinoMapCdoEndpoints); n != 1 {
		t.Errorf("refusals counted: %v, want 1", n)
	}
	if u := c.usage(bpf.CoordinoMapCdoEndpoints); !u.Refusing || u.UpdateFailures != 1 || u.Entries != 4 {
		t.Errorf("usage %+v, want refusing with 1 failure at 4/4", u)
	}
	if err := c.dp.DetachEndpoint(c.eps["c"]); err != nil {
		t.Fatal(err)
	}
	if u := c.usage(bpf.CoordinoMapCdoEndpoints); u.Refusing {
		t.Errorf("still refusing with room: %+v", u)
	}
	if err := c.dp.AttachEndpoint(ep); err != nil {
		t.Fatalf("attach with room again: %v", err)
	}
}

// TestSourceMapFullLeavesNoAddress: a dual-stack endpoint whose second
// address does not fit fails, and its first address does not stay allowed
// as a source (the old code left it).
func TestSourceMapFullLeavesNoAddress(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, MapSizes: MapSizes{SourceAddrs: 4}}, false)
	ep, err := c.attachNew("d", podIPs["d"], podIPs6["d"])
	var full *MapFullError
	if !errors.As(err, &full) || full.Map != bpf.CoordinoMapCdoEpAddrs {
		t.Fatalf("attach of two addresses into one free slot: got %v, want a MapFullError of cdo_ep_addrs", err)
	}
	c.assertNothingOf(ep)
	if n := c.refusals(bpf.CoordinoMapCdoEpAddrs); n != 1 {
		t.Errorf("refusals counted: %v, want 1", n)
	}
	if _, err := c.attachNew("e", netip.MustParseAddr("198.51.100.14")); err != nil {
		t.Fatalf("single-address endpoint into the free slot: %v", err)
	}
}

const (
	// clientToExt lets a reach the outside block on TCP 80.
	clientToExt = `
metadata: {name: client-ext, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 203.0.113.0/24}}], ports: [{port: 80}]}]`
	// clientToExtButExt excepts ext's /28 from it.
	clientToExtButExt = `
metadata: {name: client-ext, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 203.0.113.0/24, except: [203.0.113.0/28]}}], ports: [{port: 80}]}]`
)

// TestIpcacheFullNeverAllows: the ipcache has room for the node, the pods
// and the /24 allowed to a, not for the exception that takes ext out of
// it. ext must then be denied, not keep resolving to the allowed /24.
func TestIpcacheFullNeverAllows(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, MapSizes: MapSizes{Ipcache: 6}, retryDelay: 20 * time.Millisecond}, false)
	c.policies(clientToExt)
	c.expect(true, "a>ext tcp/80")
	if err := c.tryPolicies(clientToExtButExt); err == nil {
		t.Fatal("update that does not fit the ipcache succeeded")
	}
	c.expect(false, "a>ext tcp/80")
	// Retries (withholding the /24 frees room for the /28, then the /24
	// does not fit) keep it denied.
	time.Sleep(200 * time.Millisecond)
	c.expect(false, "a>ext tcp/80")
	if n := c.refusals(bpf.CoordinoMapCdoIpcache); n < 1 {
		t.Errorf("ipcache refusals counted: %v", n)
	}
	if u := c.usage(bpf.CoordinoMapCdoIpcache); !u.Refusing {
		t.Errorf("usage %+v, want refusing", u)
	}
	// Back to a policy that fits: the stale /28 leaves although the /24
	// may not fit at first, and the withheld /24 returns.
	_ = c.tryPolicies(clientToExt)
	deadline := time.Now().Add(5 * time.Second)
	for c.pods["a"].Probe("tcp", c.pods["ext"].IP, 80) != nil {
		if time.Now().After(deadline) {
			t.Fatal("a>ext not allowed again within 5 s of a policy that fits")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if u := c.usage(bpf.CoordinoMapCdoIpcache); u.Refusing {
		t.Errorf("usage %+v, want no longer refusing", u)
	}
}

// TestPolicyMapFullCountedAndShown: a policy update that does not fit is
// counted per map and shown until an update fits again.
func TestPolicyMapFullCountedAndShown(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, MapSizes: MapSizes{Policy: failClosedMapSize}}, false)
	c.policies(denyServerIngress)
	if err := c.tryPolicies(denyServerIngress, serverFromClient, clientEgressPorts(failClosedMapSize, false)); err == nil {
		t.Fatal("oversized update succeeded")
	}
	if n := c.refusals(bpf.CoordinoMapCdoPolicy); n < 1 {
		t.Errorf("policy refusals counted: %v", n)
	}
	if u := c.usage(bpf.CoordinoMapCdoPolicy); !u.Refusing || u.UpdateFailures == 0 {
		t.Errorf("usage %+v, want refusing", u)
	}
	c.policies(denyServerIngress, serverFromClient, clientEgressPorts(10, true))
	if u := c.usage(bpf.CoordinoMapCdoPolicy); u.Refusing {
		t.Errorf("usage %+v, want no longer refusing", u)
	}
}

// TestResizeKeepsEntries: reopening with other capacities keeps every
// endpoint, address and policy entry, and enforcement with it; a size
// smaller than the entries held is an error naming the flag.
func TestResizeKeepsEntries(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC}, false)
	c.policies(serverIngress)
	c.expect(true, "a>b tcp/80")
	c.expect(false, "c>b tcp/80")
	before := map[string]MapUsage{}
	us, _ := c.dp.MapUsage()
	for _, u := range us {
		before[u.Name] = u
	}
	c.dp.Close()
	small := c.cfg
	small.MapSizes = MapSizes{Policy: 4, Ipcache: 4}
	if _, err := Open(small); err == nil || !strings.Contains(err.Error(), "more than --ipcache-map-size 4") {
		t.Fatalf("Open with maps smaller than their content: %v", err)
	}
	c.cfg.MapSizes = MapSizes{Endpoints: 64, Ipcache: 64, Policy: 64, SourceAddrs: 64, NodeIsolation: 64}
	c.open()
	for _, u := range mustUsage(t, c.dp) {
		b, ok := before[u.Name]
		if !ok || u.Name == bpf.CoordinoMapCdoConntrack {
			continue
		}
		if u.Entries != b.Entries {
			t.Errorf("%s: %d entries after resize, %d before", u.Name, u.Entries, b.Entries)
		}
		if u.Name != stateMapName && u.Name != ctPurgeMapName && u.Capacity != 64 { // userspace-only maps keep their fixed size
			t.Errorf("%s: capacity %d, want 64", u.Name, u.Capacity)
		}
	}
	// The copied entries enforce before any update, and the re-attached
	// programs read the new maps: an update reaches them.
	c.expect(true, "a>b tcp/80")
	c.expect(false, "c>b tcp/80")
	c.policies(denyServerIngress)
	c.expect(false, "a>b tcp/80", "c>b tcp/80")
}

func mustUsage(t *testing.T, d *Datapath) []MapUsage {
	t.Helper()
	us, err := d.MapUsage()
	if err != nil {
		t.Fatal(err)
	}
	return us
}

func TestMapSizesValidate(t *testing.T) {
	for _, tc := range []struct {
		s    MapSizes
		want string
	}{
		{MapSizes{Endpoints: 1 << 17}, "endpoints-map-size 131072: want 4 to 65536"},
		{MapSizes{Ipcache: 1}, "ipcache-map-size 1: want 4 to 16777216"},
		{MapSizes{Policy: -1}, "policy-map-size -1: want 4 to 16777216"},
		{MapSizes{SourceAddrs: 1 << 30}, "source-map-size 1073741824: want 4 to 4194304"},
		{MapSizes{Frags: 8}, "frag-map-size 8: want 64 to 1048576"},
		{MapSizes{NodeIsolation: 2}, "node-isolation-map-size 2: want 4 to 1048576"},
	} {
		if err := tc.s.Validate(); err == nil || err.Error() != tc.want {
			t.Errorf("%+v: got %v, want %q", tc.s, err, tc.want)
		}
	}
	if err := DefaultMapSizes().Validate(); err != nil {
		t.Error(err)
	}
}

// nodeToNodeTCP isolates node -> node traffic, allowing TCP port to endPort.
func nodeToNodeTCP(port, endPort int32) *coordinov1alpha1.NodeIsolationPolicy {
	return &coordinov1alpha1.NodeIsolationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "nodes"},
		Spec: coordinov1alpha1.NodeIsolationPolicySpec{PolicyTypes: []string{coordinov1alpha1.PolicyTypeNodeToNode},
			NodeToNode: []coordinov1alpha1.HostPortRule{{Protocol: "TCP", Port: 22}, {Protocol: "TCP", Port: port, EndPort: endPort}}}}
}

// nodeOpens reports whether cdo_from_node lets peerNode open a TCP
// connection to this node's port.
func (c *cluster) nodeOpens(port uint16) bool {
	c.t.Helper()
	ret, _ := runUnderlay(c.t, c, frame(peerNode, testnet.NodeIP, protoTCP, tcp(40000, port, tcpSYN)))
	return ret != actShot
}

// TestNodeIsolationMapFull: a NodeIsolationPolicy whose port range takes
// more entries than the map holds fails with a MapFullError naming the
// flag, is counted, shown as refusing and retried; nothing the policy
// denies is let through meanwhile, and a policy that fits again ends it.
func TestNodeIsolationMapFull(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, MapSizes: MapSizes{NodeIsolation: 8}, retryDelay: 20 * time.Millisecond}, false)
	if err := c.dp.SetRemoteNodeIPs([]netip.Addr{peerNode}); err != nil {
		t.Fatal(err)
	}
	fits := nodeToNodeTCP(80, 81) // 22, 80/15: two entries
	if err := c.dp.UpdatePolicy(policy.Snapshot{NodeIsolation: []*coordinov1alpha1.NodeIsolationPolicy{fits}}); err != nil {
		t.Fatal(err)
	}
	denied := []uint16{23, 79, 82, 999, 2001}
	check := func(when string, allowed ...uint16) {
		t.Helper()
		for _, port := range allowed {
			if !c.nodeOpens(port) {
				t.Errorf("%s: node -> node tcp/%d denied, want allowed", when, port)
			}
		}
		for _, port := range denied {
			if c.nodeOpens(port) {
				t.Errorf("%s: node -> node tcp/%d allowed, but no policy allows it", when, port)
			}
		}
	}
	check("policy that fits", 22, 80, 81)

	// 1000-2000 are 11 prefix entries: with 22 more than 8.
	tooBig := nodeToNodeTCP(1000, 2000)
	err := c.dp.UpdatePolicy(policy.Snapshot{NodeIsolation: []*coordinov1alpha1.NodeIsolationPolicy{tooBig}})
	var full *MapFullError
	if !errors.As(err, &full) || full.Map != bpf.CoordinoMapCdoNodeiso || full.Capacity != 8 {
		t.Fatalf("node isolation of more entries than the map holds: got %v, want a MapFullError of cdo_nodeiso", err)
	}
	if !strings.Contains(err.Error(), "raise --node-isolation-map-size") {
		t.Errorf("error %q does not name the flag", err)
	}
	check("policy that does not fit", 22)
	if u := c.usage(bpf.CoordinoMapCdoNodeiso); !u.Refusing || u.UpdateFailures == 0 || u.Capacity != 8 {
		t.Errorf("usage %+v, want refusing at capacity 8", u)
	}
	first := c.refusals(bpf.CoordinoMapCdoNodeiso)
	if first < 1 {
		t.Errorf("node isolation refusals counted: %v", first)
	}
	// Retried without a new snapshot: each retry is refused again.
	deadline := time.Now().Add(5 * time.Second)
	for c.refusals(bpf.CoordinoMapCdoNodeiso) <= first {
		if time.Now().After(deadline) {
			t.Fatal("node isolation not retried within 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	check("after retries", 22)

	if err := c.dp.UpdatePolicy(policy.Snapshot{NodeIsolation: []*coordinov1alpha1.NodeIsolationPolicy{fits}}); err != nil {
		t.Fatalf("back to a policy that fits: %v", err)
	}
	check("policy that fits again", 22, 80, 81)
	if u := c.usage(bpf.CoordinoMapCdoNodeiso); u.Refusing || u.Entries != 2 {
		t.Errorf("usage %+v, want 2 entries, no longer refusing", u)
	}
}

// TestNodeConntrackEvictionFailsClosed: under node-to-node isolation, the
// replies to a UDP flow this node opened pass by the entry cdo_to_node made
// (a reply nobody asked for drops); a pod's flood that evicts that entry
// makes the next reply drop (node-to-node-denied), never pass, until the
// node sends again.
func TestNodeConntrackEvictionFailsClosed(t *testing.T) {
	const size = MinConntrackSize
	c := newClusterWith(t, Config{AttachMode: AttachTC, ConntrackSize: size}, false)
	if err := c.dp.SetRemoteNodeIPs([]netip.Addr{peerNode}); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.UpdatePolicy(policy.Snapshot{NodeIsolation: []*coordinov1alpha1.NodeIsolationPolicy{nodeToNodeTCP(80, 81)}}); err != nil {
		t.Fatal(err)
	}
	query := frame(testnet.NodeIP, peerNode, protoUDP, udp(40000, 53, []byte("query")))
	reply := func(dport uint16) bool {
		ret, _ := runUnderlay(t, c, frame(peerNode, testnet.NodeIP, protoUDP, udp(53, dport, []byte("answer"))))
		return ret != actShot
	}
	nodeSends := func() {
		t.Helper()
		if ret := runProg(t, c.dp.objs.CdoToNode, 1, query); ret == actShot {
			t.Fatal("cdo_to_node dropped the node's own query")
		}
	}

	nodeSends()
	if !reply(40000) {
		t.Fatal("the reply to the node's query dropped")
	}
	if reply(40001) {
		t.Fatal("a reply to no query of the node passed node-to-node isolation")
	}
	// c, not isolated, opens more UDP flows than the table holds, each
	// used twice: a flow seen once is the LRU's first victim.
	for port := range uint16(8 * size) {
		for range 2 {
			if !c.fromPod("c", frame(podIPs["c"], podIPs["b"], protoUDP, udp(1000+port, 9, []byte("x")))) {
				t.Fatalf("c's datagram %d dropped", port)
			}
		}
	}
	before := reasonCount(t, c, "node-to-node-denied")
	if reply(40000) {
		t.Error("a reply whose flow's entry was evicted passed node-to-node isolation")
	}
	if reasonCount(t, c, "node-to-node-denied") <= before {
		t.Error("the dropped reply not counted as node-to-node-denied")
	}
	nodeSends()
	if !reply(40000) {
		t.Error("the reply to the node's query sent again dropped")
	}
}
