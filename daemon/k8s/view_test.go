package k8s

import (
	"reflect"
	"testing"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	coordinolisters "github.com/coordino/coordino/api/client/listers/coordino/v1alpha1"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/policy"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnplisters "sigs.k8s.io/network-policy-api/pkg/client/listers/apis/v1beta1"
)

// testLiveView is a liveView over listers filled with objs.
func testLiveView(t *testing.T, node string, objs ...any) *liveView {
	t.Helper()
	idx := func() cache.Indexer {
		return cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	}
	pods, nss, irs, ncs, ids, nips, cnps, nodes := idx(), idx(), idx(), idx(), idx(), idx(), idx(), idx()
	for _, o := range objs {
		var into cache.Indexer
		switch o.(type) {
		case *corev1.Pod:
			into = pods
		case *corev1.Namespace:
			into = nss
		case *coordinov1alpha1.PolicyIR:
			into = irs
		case *coordinov1alpha1.NodeConfig:
			into = ncs
		case *coordinov1alpha1.Identity:
			into = ids
		case *coordinov1alpha1.NodeIsolationPolicy:
			into = nips
		case *cnpv1beta1.ClusterNetworkPolicy:
			into = cnps
		case *corev1.Node:
			into = nodes
		default:
			t.Fatalf("no lister for %T", o)
		}
		if err := into.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	return &liveView{node: node, pods: corelisters.NewPodLister(pods), nss: corelisters.NewNamespaceLister(nss),
		irs: coordinolisters.NewPolicyIRLister(irs), ncs: coordinolisters.NewNodeConfigLister(ncs),
		idents: coordinolisters.NewIdentityLister(ids), nips: coordinolisters.NewNodeIsolationPolicyLister(nips),
		cnps: cnplisters.NewClusterNetworkPolicyLister(cnps), nodes: corelisters.NewNodeLister(nodes)}
}

// TestViewsAgree: the last-known state saved from the live view answers
// every question the source asks as the live view did, so a daemon
// restarted during an API outage applies what it applied before.
func TestViewsAgree(t *testing.T) {
	live := testLiveView(t, "n1",
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u1", Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "db", UID: "u2", Labels: map[string]string{"app": "db"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{"team": "x"}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other"}},
		&coordinov1alpha1.PolicyIR{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b"}},
		&coordinov1alpha1.PolicyIR{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}},
		&coordinov1alpha1.NodeConfig{ObjectMeta: metav1.ObjectMeta{Name: "n1", Generation: 3},
			Spec: coordinov1alpha1.NodeConfigSpec{Blocks: []coordinov1alpha1.NodeBlock{{CIDR: "10.0.0.0/26"}}}},
		&coordinov1alpha1.NodeConfig{ObjectMeta: metav1.ObjectMeta{Name: "n2", Generation: 9}},
		&coordinov1alpha1.Identity{ObjectMeta: metav1.ObjectMeta{Name: "300"},
			Spec: coordinov1alpha1.IdentitySpec{Namespace: "ns", Labels: map[string]string{"app": "web"}}},
		&coordinov1alpha1.NodeIsolationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "iso"}},
		&cnpv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "tenants"}, Spec: cnpv1beta1.ClusterNetworkPolicySpec{Tier: cnpv1beta1.AdminTier, Priority: 4}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"role": "infra"}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}}}},
	)
	known := live.state()
	if known == nil {
		t.Fatal("the live view has no state to save")
	}
	if !live.live() || known.live() {
		t.Fatal("live() does not tell the views apart")
	}
	for _, v := range []view{live, known} {
		name := reflect.TypeOf(v).String()
		if blocks, gen, ok := v.nodeBlocks(); !ok || gen != 3 || len(blocks) != 1 || blocks[0].CIDR != "10.0.0.0/26" {
			t.Errorf("%s: blocks %v generation %d %v, want n1's", name, blocks, gen, ok)
		}
		if l, ok := v.namespaceLabels("ns"); !ok || l["team"] != "x" {
			t.Errorf("%s: namespace labels %v %v", name, l, ok)
		}
		if _, ok := v.namespaceLabels("gone"); ok {
			t.Errorf("%s: an unknown namespace has labels", name)
		}
		if l, ok := v.podLabels("ns", "web", "u1"); !ok || l["app"] != "web" {
			t.Errorf("%s: pod labels %v %v", name, l, ok)
		}
		if _, ok := v.podLabels("ns", "web", "u-other"); ok {
			t.Errorf("%s: labels of another pod of the same name", name)
		}
		if ports := v.namedPorts(); len(ports) != 1 || len(ports["ns/web"]) != 1 || ports["ns/web"][0].Port != 8080 {
			t.Errorf("%s: named ports %v, want web's http only", name, ports)
		}
		if ids := v.identities(); len(ids) != 1 || ids[0].Name != "300" || ids[0].Spec.Labels["app"] != "web" {
			t.Errorf("%s: identities %v", name, ids)
		}
		snap := snapshot(v)
		if len(snap.PolicyIRs) != 2 || snap.PolicyIRs[0].Name != "a" || len(snap.Namespaces) != 2 || snap.Namespaces[0].Name != "ns" ||
			len(snap.NodeIsolation) != 1 {
			t.Errorf("%s: snapshot %d IRs (first %q), %d namespaces, %d isolation policies", name,
				len(snap.PolicyIRs), snap.PolicyIRs[0].Name, len(snap.Namespaces), len(snap.NodeIsolation))
		}
		if len(snap.ClusterPolicies) != 1 || snap.ClusterPolicies[0].Spec.Priority != 4 {
			t.Errorf("%s: cluster policies %v", name, snap.ClusterPolicies)
		}
		if len(snap.Nodes) != 1 || snap.Nodes[0].Labels["role"] != "infra" || len(policy.NodeAddrs(snap.Nodes[0])) != 1 {
			t.Errorf("%s: nodes %v, want n1 with its label and address", name, snap.Nodes)
		}
	}
	if _, ok := live.nodeConfig(); !ok {
		t.Error("the live view has no NodeConfig to write status to")
	}
	if _, ok := known.nodeConfig(); ok {
		t.Error("the last-known view offers a NodeConfig to write status to")
	}
	if known.state() != nil {
		t.Error("the last-known view would save itself again")
	}
}

// TestNoLastKnown: a run with no saved state knows nothing until it is
// live, and a live view whose NodeConfig is not cached yet saves the blocks
// it started from.
func TestNoLastKnown(t *testing.T) {
	var none *lastKnown
	var v view = none
	if _, _, ok := v.nodeBlocks(); ok {
		t.Error("no state, yet blocks")
	}
	if _, ok := v.podLabels("ns", "p", ""); ok || len(v.namedPorts()) != 0 || len(v.identities()) != 0 {
		t.Error("no state, yet pods or identities")
	}
	if snap := v.policy(); len(snap.PolicyIRs)+len(snap.Namespaces) != 0 {
		t.Error("no state, yet policy")
	}
	live := testLiveView(t, "n1")
	live.known = &lastKnown{Blocks: []coordinov1alpha1.NodeBlock{{CIDR: "10.1.0.0/26"}}, Generation: 5}
	if st := live.state(); st.Generation != 5 || len(st.Blocks) != 1 {
		t.Errorf("saved %+v, want the blocks started from", st)
	}
}

// viewSink keeps what the source fed it; the rest of Sink is Discard's.
type viewSink struct {
	Discard
	snaps []policy.Snapshot
	ids   map[identity.ID]bool
	ports map[string][]policy.NamedPort
}

func (v *viewSink) UpdatePolicy(s policy.Snapshot) error { v.snaps = append(v.snaps, s); return nil }
func (v *viewSink) UpsertIdentity(id identity.Identity) error {
	v.ids[id.ID] = true
	return nil
}
func (v *viewSink) DeleteIdentity(id identity.ID) error { delete(v.ids, id); return nil }
func (v *viewSink) SetPodNamedPorts(pod string, ports []policy.NamedPort) error {
	if ports == nil {
		delete(v.ports, pod)
	} else {
		v.ports[pod] = ports
	}
	return nil
}

// TestApplyFollowsTheView: the source applies the last-known state until it
// goes live, then converges on the informers' view: identities, named
// ports, policy and blocks that are gone from it are withdrawn.
func TestApplyFollowsTheView(t *testing.T) {
	pool, err := ipam.NewPool(nil)
	if err != nil {
		t.Fatal(err)
	}
	known := &lastKnown{
		Blocks: []coordinov1alpha1.NodeBlock{{CIDR: "10.9.0.0/26"}}, Generation: 2,
		Namespaces: map[string]map[string]string{"ns": {}},
		Pods: map[string]knownPod{"ns/old": {UID: "u0", Labels: map[string]string{"app": "old"},
			NamedPorts: []policy.NamedPort{{Name: "http", Protocol: policy.ProtoTCP, Port: 80}}}},
		Identities: map[string]coordinov1alpha1.IdentitySpec{"400": {Namespace: "ns", Labels: map[string]string{"app": "old"}}},
		PolicyIRs:  []*coordinov1alpha1.PolicyIR{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "old"}}},
	}
	live := testLiveView(t, "n1",
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}},
		&coordinov1alpha1.NodeConfig{ObjectMeta: metav1.ObjectMeta{Name: "n1", Generation: 3},
			Spec: coordinov1alpha1.NodeConfigSpec{Blocks: []coordinov1alpha1.NodeBlock{{CIDR: "10.9.1.0/26"}}}},
		&coordinov1alpha1.Identity{ObjectMeta: metav1.ObjectMeta{Name: "401"},
			Spec: coordinov1alpha1.IdentitySpec{Namespace: "ns", Labels: map[string]string{"app": "new"}}},
		&coordinov1alpha1.PolicyIR{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "new"}},
	)
	live.known = known
	s := &Source{cfg: Config{NodeName: "n1", Pool: pool, ExcludedLabels: coordinov1alpha1.DefaultExcludedLabels},
		log: zap.NewNop(), remote: newRemoteEndpoints("n1", zap.NewNop()), inf: &informerSet{live: live},
		announced: map[identity.ID]identity.Identity{}, fedPorts: map[string][]policy.NamedPort{},
		kick: make(chan struct{}, 1), publishKick: make(chan struct{}, 1)}
	s.ids = NewIdentities(func(name string) (map[string]string, bool) { return s.view().namespaceLabels(name) })
	s.setView(known)
	sink := &viewSink{ids: map[identity.ID]bool{}, ports: map[string][]policy.NamedPort{}}
	check := func(step string, block string, gen int64, id identity.ID, pods []string, ir string) {
		t.Helper()
		s.markDirty(func(d *dirtyBits) { *d = everything })
		s.apply(sink)
		if u := pool.Usage(); len(u) != 1 || u[0].Prefix.String() != block || s.applied.Load() != gen {
			t.Errorf("%s: pool %v at generation %d, want %s at %d", step, u, s.applied.Load(), block, gen)
		}
		if len(sink.ids) != 1 || !sink.ids[id] {
			t.Errorf("%s: sink's identities %v, want only %d", step, sink.ids, id)
		}
		if len(sink.ports) != len(pods) {
			t.Errorf("%s: sink's named ports %v, want those of %v", step, sink.ports, pods)
		}
		for _, p := range pods {
			if _, ok := sink.ports[p]; !ok {
				t.Errorf("%s: sink has no named ports of %s", step, p)
			}
		}
		last := sink.snaps[len(sink.snaps)-1]
		if len(last.PolicyIRs) != 1 || last.PolicyIRs[0].Name != ir {
			t.Errorf("%s: policy %v, want PolicyIR %s", step, last.PolicyIRs, ir)
		}
	}
	check("last known", "10.9.0.0/26", 2, 400, []string{"ns/old"}, "old")
	if _, ok := s.podLabelsNow("ns", "old", "u0"); !ok {
		t.Error("last known: the saved pod's labels are not served")
	}
	s.goLive()
	check("live", "10.9.1.0/26", 3, 401, nil, "new")
	if _, ok := s.podLabelsNow("ns", "old", "u0"); ok {
		t.Error("live: a pod gone from the cluster still has labels")
	}
}

// TestNodeEventsFilter: a Node is stripped to what policy reads, and only
// a change of its labels or addresses marks policy dirty (status
// heartbeats do not).
func TestNodeEventsFilter(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"role": "infra"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"},
			{Type: corev1.NodeHostName, Address: "n1"}}, Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady}}}}
	obj, err := policyNode(n)
	if err != nil {
		t.Fatal(err)
	}
	stripped := obj.(*corev1.Node)
	if len(stripped.Status.Addresses) != 1 || len(stripped.Status.Conditions) != 0 || stripped.Labels["role"] != "infra" {
		t.Errorf("stripped node %+v", stripped)
	}
	marks := 0
	h := nodeChanges(func() { marks++ })
	heartbeat := stripped.DeepCopy()
	heartbeat.ResourceVersion = "2"
	h.OnUpdate(stripped, heartbeat)
	if marks != 0 {
		t.Errorf("a heartbeat marked policy dirty")
	}
	relabeled := stripped.DeepCopy()
	relabeled.Labels["role"] = "worker"
	h.OnUpdate(stripped, relabeled)
	readdressed := stripped.DeepCopy()
	readdressed.Status.Addresses[0].Address = "192.0.2.2"
	h.OnUpdate(stripped, readdressed)
	if marks != 2 {
		t.Errorf("label and address changes marked %d times, want 2", marks)
	}
}
