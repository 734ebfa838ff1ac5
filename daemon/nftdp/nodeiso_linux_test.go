package nftdp

import (
	"io"
	"maps"
	"net"
	"net/netip"
	"strconv"
	"testing"

	"sigs.k8s.io/yaml"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/nodeiso"
	"github.com/coordino/coordino/daemon/policy"
)

// The node isolation test's policy, as test/multinode's: pods may open
// port 7000 on their own node and port 80 on other nodes; other nodes may
// open port 7001 here.
const nodeIsoDoc = `metadata: {name: pods-and-nodes}
spec:
  podToHost:
  - {protocol: TCP, port: 7000, scope: OwnNode}
  - {protocol: TCP, port: 80, scope: OtherNodes}
  nodeToNode:
  - {protocol: TCP, port: 7001}
`

func nodeIsoPolicy(t testing.TB, doc string) *coordinov1alpha1.NodeIsolationPolicy {
	t.Helper()
	p := &coordinov1alpha1.NodeIsolationPolicy{}
	if err := yaml.UnmarshalStrict([]byte(doc), p); err != nil {
		t.Fatalf("bad node isolation policy: %v", err)
	}
	return p
}

// serveNode echoes TCP on the node's address (the test's netns).
func serveNode(t testing.TB, port int) {
	t.Helper()
	l, err := net.Listen("tcp4", netip.AddrPortFrom(testnet.NodeIP, uint16(port)).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
}

// serveNodeUDP echoes UDP on the node's address.
func serveNodeUDP(t testing.TB, port int) {
	t.Helper()
	pc, err := net.ListenPacket("udp4", netip.AddrPortFrom(testnet.NodeIP, uint16(port)).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}

// expectNode probes "from>node tcp/port": a pod, or "ext" (another node
// here), towards this node's address.
func (c *cluster) expectNode(allowed bool, from string, ports ...int) {
	c.t.Helper()
	for _, port := range ports {
		err := c.pods[from].Probe("tcp", testnet.NodeIP, port)
		if allowed && err != nil {
			c.t.Errorf("%s>node tcp/%d: want allowed, got %v", from, port, err)
		}
		if !allowed && err == nil {
			c.t.Errorf("%s>node tcp/%d: want denied, got through", from, port)
		}
	}
}

// TestNodeIsolation: the host "ext" is another node (its address comes
// as the eBPF datapath gets it, SetRemoteNodeIPs). With the policy, pods
// reach only the allowed ports of this node and of other nodes, other
// nodes only the allowed ports of this node; probes (node -> pod) and the
// pod network are untouched; drops are reported with the eBPF datapath's
// reasons; a port change is a few element changes; removing the policy
// opens everything again.
func TestNodeIsolation(t *testing.T) {
	c := newCluster(t, false)
	rec := c.readFlows()
	for _, port := range []int{7000, 7001} {
		serveNode(t, port)
	}
	ext := podIPs["ext"]
	if err := c.dp.SetRemoteNodeIPs([]netip.Addr{ext}); err != nil {
		t.Fatal(err)
	}
	c.expectNode(true, "a", 7000, 7001)
	c.expectNode(true, "ext", 7000, 7001)

	s := snapshotOf(t)
	s.NodeIsolation = []*coordinov1alpha1.NodeIsolationPolicy{nodeIsoPolicy(t, nodeIsoDoc)}
	if err := c.dp.UpdatePolicy(s); err != nil || c.dp.NotEnforced() != "" {
		t.Fatalf("UpdatePolicy: %v, NotEnforced %q", err, c.dp.NotEnforced())
	}
	c.expectNode(true, "a", 7000)
	c.expectNode(false, "a", 7001)
	c.expectNode(true, "ext", 7001)
	c.expectNode(false, "ext", 7000)
	c.expect(true, "a>ext tcp/80", "node>a tcp/81", "a>b tcp/81", "c>b udp/80")
	c.expect(false, "a>ext tcp/81")

	rec.wait(t, "pod -> node dropped as node-isolated", func(f datapath.Flow) bool {
		return f.Reason == reasonNodeIsolated && f.Direction == "egress" && f.DstPort == 7001 &&
			f.Endpoint == c.eps["a"].Key && f.RemoteIdentity == uint32(identity.Host)
	})
	rec.wait(t, "pod -> other node dropped as node-isolated", func(f datapath.Flow) bool {
		return f.Reason == reasonNodeIsolated && f.DstPort == 81 && f.RemoteIdentity == uint32(identity.RemoteNode)
	})
	rec.wait(t, "node -> node dropped as node-to-node-denied", func(f datapath.Flow) bool {
		return f.Reason == reasonNodeDenied && f.Direction == "ingress" && f.DstPort == 7000 &&
			f.Src == ext && f.RemoteIdentity == uint32(identity.RemoteNode)
	})

	// Opening another port is an element added, no chain touched.
	s.NodeIsolation = []*coordinov1alpha1.NodeIsolationPolicy{nodeIsoPolicy(t, nodeIsoDoc+"  - {protocol: TCP, port: 7000}\n")}
	if err := c.dp.UpdatePolicy(s); err != nil {
		t.Fatal(err)
	}
	if c.dp.stats.lastOps != 2 || c.dp.stats.lastChainAdds != 0 { // the old range out, the merged one in
		t.Errorf("port added: %d changes, %d chains created; want 2 element changes", c.dp.stats.lastOps, c.dp.stats.lastChainAdds)
	}
	c.expectNode(true, "ext", 7000, 7001)

	// A restarted daemon keeps isolation in force until its first
	// snapshot, and that snapshot's transaction replaces it whole.
	c.dp.Close()
	c.open()
	c.expectNode(false, "a", 7001)
	if err := c.dp.SetRemoteNodeIPs([]netip.Addr{ext}); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.UpdatePolicy(s); err != nil {
		t.Fatal(err)
	}
	c.expectNode(false, "a", 7001)
	c.expect(false, "a>ext tcp/81")

	if err := c.dp.UpdatePolicy(snapshotOf(t)); err != nil {
		t.Fatal(err)
	}
	c.expectNode(true, "a", 7000, 7001)
	c.expect(true, "a>ext tcp/81")
}

// TestNodeIsolationKeepsTunnelsOpen: the tunnel ports nodes always accept
// from each other go in with the first node-to-node rule, and only other
// nodes' addresses are judged.
func TestNodeIsolationKeepsTunnelsOpen(t *testing.T) {
	c := newCluster(t, false)
	serveNode(t, 7002)
	serveNodeUDP(t, 7002)
	if err := c.dp.SetTunnelPorts([]uint16{7002}); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.SetRemoteNodeIPs([]netip.Addr{podIPs["ext"]}); err != nil {
		t.Fatal(err)
	}
	s := snapshotOf(t)
	s.NodeIsolation = []*coordinov1alpha1.NodeIsolationPolicy{nodeIsoPolicy(t, `metadata: {name: n}
spec:
  policyTypes: [NodeToNode]
  nodeToNode: [{protocol: UDP, port: 9}]
`)}
	if err := c.dp.UpdatePolicy(s); err != nil {
		t.Fatal(err)
	}
	if err := c.pods["ext"].Probe("udp", testnet.NodeIP, 7002); err != nil {
		t.Errorf("ext>node udp/7002 (the tunnel port): want allowed, got %v", err)
	}
	// The tunnel's port, not the TCP one of the same number.
	c.expectNode(false, "ext", 7002)
	elems, err := c.dp.conn.GetSetElements(c.dp.lay.sets[setIsoNode])
	if err != nil {
		t.Fatal(err)
	}
	want := map[isoElem]bool{{policy.ProtoUDP, policy.ProtoUDP, 9, 9}: true, {policy.ProtoUDP, policy.ProtoUDP, 7002, 7002}: true}
	got := 0
	for _, e := range elems {
		if !e.IntervalEnd {
			got++
		}
	}
	if got != len(want) {
		t.Errorf("iso-node holds %d ranges, want %d (the policy's port and the tunnel's)", got, len(want))
	}
	// Pods' own traffic to the node is not isolated by a NodeToNode-only
	// policy.
	c.expectNode(true, "a", 7002)
}

// TestNodeIsolationAfterSpoofCheck: as in eBPF mode, a pod's packet from
// an address not its own is dropped as spoofed before node isolation
// judges it.
func TestNodeIsolationAfterSpoofCheck(t *testing.T) {
	c := newCluster(t, false)
	serveNode(t, 7001)
	spoofed := netip.MustParseAddr("198.51.100.98")
	a := c.pods["a"]
	addPodAddr(t, a, spoofed)
	s := snapshotOf(t)
	s.NodeIsolation = []*coordinov1alpha1.NodeIsolationPolicy{nodeIsoPolicy(t, "metadata: {name: all}\n")}
	if err := c.dp.UpdatePolicy(s); err != nil {
		t.Fatal(err)
	}
	err := a.Do(func() error {
		d := net.Dialer{Timeout: testnet.Timeout, LocalAddr: &net.TCPAddr{IP: spoofed.AsSlice()}}
		conn, err := d.Dial("tcp4", netip.AddrPortFrom(testnet.NodeIP, 7001).String())
		if err == nil {
			conn.Close()
		}
		return err
	})
	if err == nil {
		t.Fatal("spoofed connection to the node got through")
	}
	drops, err := c.dp.Drops()
	if err != nil || drops["egress-spoofed"] == 0 || drops["egress-node-isolated"] != 0 {
		t.Errorf("drops %v (%v), want the spoofed SYNs counted as spoofed", drops, err)
	}
	c.expectNode(false, "a", 7001)
}

// BenchmarkNodeIsolationChange: one port of a NodeIsolationPolicy with
// 100 rules added or removed, to the kernel's commit (the element
// differences in one transaction).
func BenchmarkNodeIsolationChange(b *testing.B) {
	c := newCluster(b, false)
	doc := "metadata: {name: many}\nspec:\n  podToHost:\n"
	for i := range 100 {
		doc += "  - {protocol: TCP, port: " + strconv.Itoa(10000+2*i) + "}\n"
	}
	snaps := [2]policy.Snapshot{snapshotOf(b), snapshotOf(b)}
	snaps[0].NodeIsolation = []*coordinov1alpha1.NodeIsolationPolicy{nodeIsoPolicy(b, doc)}
	snaps[1].NodeIsolation = []*coordinov1alpha1.NodeIsolationPolicy{nodeIsoPolicy(b, doc+"  - {protocol: TCP, port: 9000}\n")}
	if err := c.dp.UpdatePolicy(snaps[0]); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		if err := c.dp.UpdatePolicy(snaps[(i+1)%2]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	// AllNodes: one element of the own node's set and one of the others'.
	if c.dp.stats.lastOps != 2 {
		b.Errorf("a port added or removed: %d changes, want 2 elements", c.dp.stats.lastOps)
	}
}

// TestIsoElems: ICMP rules hold their protocol whole (the eBPF key has
// port 0, which the rule's block holds), port ranges merge, and the
// directions land in their own sets.
func TestIsoElems(t *testing.T) {
	p := nodeIsoPolicy(t, `metadata: {name: p}
spec:
  podToHost:
  - {protocol: ICMP, scope: OwnNode}
  - {protocol: TCP, port: 80, endPort: 90, scope: OwnNode}
  - {protocol: TCP, port: 91, scope: AllNodes}
`)
	rules, err := nodeiso.Compile([]*coordinov1alpha1.NodeIsolationPolicy{p}, []uint16{51820})
	if err != nil {
		t.Fatal(err)
	}
	byGroup := map[group][]policy.Key{}
	for _, k := range rules.Keys {
		g := group{local: k.Local, remote: k.Remote, dir: k.Dir}
		byGroup[g] = append(byGroup[g], k)
	}
	want := map[string]map[isoElem]struct{}{
		setIsoPodHost: {{1, 1, 0, 65535}: {}, {58, 58, 0, 65535}: {}, {6, 6, 80, 91}: {}},
		setIsoPodNode: {{6, 6, 91, 91}: {}},
		setIsoNode:    {},
	}
	for _, s := range isoSets {
		if got := isoElems(s.g, byGroup[s.g]); !maps.Equal(got, want[s.name]) {
			t.Errorf("%s: %v, want %v", s.name, got, want[s.name])
		}
	}
}
