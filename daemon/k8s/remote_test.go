package k8s

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// recordingSink keeps what it was told, like the datapath's remote map.
type recordingSink struct {
	Discard
	addrs map[netip.Addr]identity.ID
	calls int
	wrote int
}

func (r *recordingSink) UpdateRemoteEndpoints(upsert map[netip.Addr]identity.ID, remove []netip.Addr) error {
	r.calls++
	r.wrote += len(upsert) + len(remove)
	for _, a := range remove {
		delete(r.addrs, a)
	}
	for a, id := range upsert {
		r.addrs[a] = id
	}
	return nil
}

func nodeEndpoints(node string, entries ...coordinov1alpha1.NodeEndpoint) *coordinov1alpha1.NodeEndpoints {
	return &coordinov1alpha1.NodeEndpoints{ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec: coordinov1alpha1.NodeEndpointsSpec{EndpointCount: int32(len(entries)), Endpoints: entries}}
}

func entry(id int32, addrs ...string) coordinov1alpha1.NodeEndpoint {
	return coordinov1alpha1.NodeEndpoint{Identity: id, Addresses: addrs}
}

// TestRemoteEndpointsDeltas: each apply sends only what changed; the own
// node's object and bad entries are ignored; an address taken over by
// another node is not withdrawn by the old node's late update.
func TestRemoteEndpointsDeltas(t *testing.T) {
	r := newRemoteEndpoints("self", zap.NewNop())
	sink := &recordingSink{addrs: map[netip.Addr]identity.ID{}}
	h := r.handler(func() {})
	h.OnAdd(nodeEndpoints("self", entry(300, "10.0.0.1")), false)
	h.OnAdd(nodeEndpoints("a", entry(300, "10.1.0.1", "fd00:1::1"), entry(301, "10.1.0.2"), entry(5, "10.1.0.3"), entry(302, "bogus")), false)
	h.OnAdd(nodeEndpoints("b", entry(300, "10.2.0.1")), false)
	r.apply(sink)
	want := map[netip.Addr]identity.ID{
		netip.MustParseAddr("10.1.0.1"): 300, netip.MustParseAddr("fd00:1::1"): 300,
		netip.MustParseAddr("10.1.0.2"): 301, netip.MustParseAddr("10.2.0.1"): 300,
	}
	check := func(step string) {
		t.Helper()
		if len(sink.addrs) != len(want) {
			t.Fatalf("%s: sink has %v, want %v", step, sink.addrs, want)
		}
		for a, id := range want {
			if sink.addrs[a] != id {
				t.Fatalf("%s: %v has %v, want %v (all: %v)", step, a, sink.addrs[a], id, sink.addrs)
			}
		}
	}
	check("initial")

	// One pod leaves node a, one changes identity: two writes.
	sink.wrote = 0
	h.OnUpdate(nil, nodeEndpoints("a", entry(300, "10.1.0.1", "fd00:1::1"), entry(303, "10.1.0.2")))
	r.apply(sink)
	want[netip.MustParseAddr("10.1.0.2")] = 303
	check("update")
	if sink.wrote != 1 {
		t.Fatalf("identity change of one address cost %d writes, want 1", sink.wrote)
	}

	// 10.2.0.1 moves to node a before b's object drops it.
	h.OnUpdate(nil, nodeEndpoints("a", entry(300, "10.1.0.1", "fd00:1::1"), entry(303, "10.1.0.2"), entry(304, "10.2.0.1")))
	r.apply(sink)
	h.OnUpdate(nil, nodeEndpoints("b"))
	r.apply(sink)
	want[netip.MustParseAddr("10.2.0.1")] = 304
	check("takeover")

	// Node a is deleted: all of its addresses go.
	h.OnDelete(nodeEndpoints("a"))
	r.apply(sink)
	want = map[netip.Addr]identity.ID{}
	check("node deleted")
	if r.count() != 0 {
		t.Fatalf("count %d after every node left", r.count())
	}
}

// BenchmarkRemoteEndpointsMemory reports the daemon memory held per
// 100,000 remote endpoints (110 pods a node, the Kubernetes default): the
// informer's decoded NodeEndpoints objects plus the per-node maps and the
// datapath-side address map. The reference, measured in the same run, is
// the same pods as full Pod objects, what watching every Pod would hold.
func BenchmarkRemoteEndpointsMemory(b *testing.B) {
	const total, perNode = 100_000, 110
	for i := 0; i < b.N; i++ {
		ours := heapDelta(func() any {
			r := newRemoteEndpoints("self", zap.NewNop())
			sink := &recordingSink{addrs: map[netip.Addr]identity.ID{}}
			h := r.handler(func() {})
			var objs []*coordinov1alpha1.NodeEndpoints
			for n := 0; n*perNode < total; n++ {
				var eps []coordinov1alpha1.NodeEndpoint
				for p := 0; p < perNode && n*perNode+p < total; p++ {
					k := n*perNode + p
					eps = append(eps, coordinov1alpha1.NodeEndpoint{Identity: int32(256 + k%5000),
						Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", k>>16&255, k>>8&255, k&255), fmt.Sprintf("fd00::%x", k)},
						NamedPorts: []coordinov1alpha1.NamedPort{{Name: "http", Protocol: "TCP", Port: 8080}}})
				}
				ne := nodeEndpoints(fmt.Sprintf("node-%05d", n), eps...)
				objs = append(objs, ne)
				h.OnAdd(ne, false)
			}
			r.apply(sink)
			return []any{objs, r, sink}
		})
		pods := heapDelta(func() any { return referencePods(total) })
		b.ReportMetric(float64(ours)/(1<<20), "MiB/100k-endpoints")
		b.ReportMetric(float64(pods)/(1<<20), "MiB/100k-pods-reference")
		b.ReportMetric(float64(ours)/float64(pods), "ratio")
	}
}

// heapDelta is the live heap build's result holds.
func heapDelta(build func() any) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	keep := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(keep)
	if after.HeapAlloc < before.HeapAlloc {
		return 0
	}
	return after.HeapAlloc - before.HeapAlloc
}

// referencePods are n modest Pod objects as an informer holds them: three
// labels, an owner, one container with a named port, addresses and the
// usual conditions.
func referencePods(n int) []*corev1.Pod {
	out := make([]*corev1.Pod, 0, n)
	for k := 0; k < n; k++ {
		name := fmt.Sprintf("web-%08d", k)
		out = append(out, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a", UID: types.UID(fmt.Sprintf("%08d-0000-0000-0000-000000000000", k)),
				ResourceVersion: fmt.Sprint(1000 + k), Labels: map[string]string{"app": "web", "role": "client", "pod-template-hash": "5d8f7c9b4"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d8f7c9b4", UID: "rs"}}},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%05d", k/110), ServiceAccountName: "default",
				Containers: []corev1.Container{{Name: "web", Image: "registry.example/web:1.2.3",
					Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fmt.Sprintf("10.%d.%d.%d", k>>16&255, k>>8&255, k&255),
				PodIPs: []corev1.PodIP{{IP: fmt.Sprintf("10.%d.%d.%d", k>>16&255, k>>8&255, k&255)}, {IP: fmt.Sprintf("fd00::%x", k)}},
				Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.ContainersReady, Status: corev1.ConditionTrue},
					{Type: corev1.PodInitialized, Status: corev1.ConditionTrue}, {Type: corev1.PodScheduled, Status: corev1.ConditionTrue}},
				ContainerStatuses: []corev1.ContainerStatus{{Name: "web", Ready: true, Image: "registry.example/web:1.2.3",
					ImageID: "registry.example/web@sha256:0123456789abcdef", ContainerID: "containerd://" + name}}},
		})
	}
	return out
}

// FuzzRemoteEntries: another node's object never panics the parser, and
// what it accepts is a cluster identity on plain pod addresses.
func FuzzRemoteEntries(f *testing.F) {
	f.Add(int32(300), "10.1.0.1", "fd00::1")
	f.Add(int32(0x800001), "10.1.0.1", "")
	f.Add(int32(-1), "fe80::1%eth0", "::")
	f.Add(int32(256), "::ffff:10.0.0.1", "not-an-ip")
	f.Fuzz(func(t *testing.T, id int32, a, b string) {
		got, _ := remoteEntries(nodeEndpoints("n", entry(id, a, b)))
		for addr, n := range got {
			if n < identity.FirstPod || n > identity.LastCluster {
				t.Fatalf("accepted identity %d", n)
			}
			if !addr.IsValid() || addr.Zone() != "" || addr.Is4In6() || addr.IsUnspecified() {
				t.Fatalf("accepted address %v", addr)
			}
		}
	})
}

func TestStatusEqualSeesWireGuard(t *testing.T) {
	a := coordinov1alpha1.NodeConfigStatus{Addresses: []string{"192.0.2.1"}}
	b := *a.DeepCopy()
	b.WireGuard = &coordinov1alpha1.WireGuardStatus{PublicKey: "k", Endpoint: "192.0.2.1:51871"}
	if statusEqual(a, b) {
		t.Fatal("a published WireGuard key is not a status change")
	}
}

func TestStatusEqualSeesBGP(t *testing.T) {
	a := coordinov1alpha1.NodeConfigStatus{BGP: []coordinov1alpha1.BGPSessionStatus{{Address: "192.0.2.254", ASN: 65000, State: "Active"}}}
	b := *a.DeepCopy()
	b.BGP[0].State, b.BGP[0].Received = "Established", 3
	if statusEqual(a, b) {
		t.Fatal("a BGP session coming up is not a status change")
	}
}

// portSink also keeps remote named ports, like the datapath.
type portSink struct {
	recordingSink
	ports map[string][]policy.NamedPort
	sets  int
}

func (p *portSink) SetPeerNamedPorts(key string, _ identity.ID, ports []policy.NamedPort) error {
	p.sets++
	if len(ports) == 0 {
		delete(p.ports, key)
	} else {
		p.ports[key] = ports
	}
	return nil
}

// TestRemoteNamedPorts: published named ports reach the sink per pod, an
// unchanged object costs nothing, and a pod or node leaving forgets them.
func TestRemoteNamedPorts(t *testing.T) {
	r := newRemoteEndpoints("self", zap.NewNop())
	sink := &portSink{recordingSink: recordingSink{addrs: map[netip.Addr]identity.ID{}}, ports: map[string][]policy.NamedPort{}}
	h := r.handler(func() {})
	web := entry(300, "10.1.0.1")
	web.NamedPorts = []coordinov1alpha1.NamedPort{{Name: "http", Protocol: "TCP", Port: 8080}, {Name: "dns", Protocol: "UDP", Port: 53}}
	plain := entry(301, "10.1.0.2")
	h.OnAdd(nodeEndpoints("a", web, plain), false)
	r.apply(sink)
	want := []policy.NamedPort{{Name: "dns", Protocol: policy.ProtoUDP, Port: 53}, {Name: "http", Protocol: policy.ProtoTCP, Port: 8080}}
	if got := sink.ports["a/10.1.0.1"]; !slices.Equal(got, want) || len(sink.ports) != 1 {
		t.Fatalf("ports after add: %v, want only a/10.1.0.1 = %v", sink.ports, want)
	}
	sets := sink.sets
	h.OnUpdate(nil, nodeEndpoints("a", web, plain))
	r.apply(sink)
	if sink.sets != sets {
		t.Fatalf("an unchanged object cost %d named-port writes", sink.sets-sets)
	}
	h.OnUpdate(nil, nodeEndpoints("a", plain))
	r.apply(sink)
	if len(sink.ports) != 0 {
		t.Fatalf("ports of a pod that left remain: %v", sink.ports)
	}
	h.OnUpdate(nil, nodeEndpoints("a", web))
	r.apply(sink)
	h.OnDelete(nodeEndpoints("a"))
	r.apply(sink)
	if len(sink.ports) != 0 {
		t.Fatalf("ports of a deleted node remain: %v", sink.ports)
	}
}
