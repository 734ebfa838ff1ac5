package k8s

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"

	coordinolisters "github.com/coordino/coordino/api/client/listers/coordino/v1alpha1"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/policy"
	cnplisters "sigs.k8s.io/network-policy-api/pkg/client/listers/apis/v1beta1"
)

// view is how the source reads the cluster. There are two: liveView, the
// informers' listers once they have synced, and *lastKnown, the state a
// previous run saved, served until then. The source swaps the first in for
// the second when it goes live; nothing else asks which one it reads.
type view interface {
	// live reports whether this is the API server's view (the
	// coordino_k8s_live gauge): NodeEndpoints are complete and may be
	// published and confirmed only then.
	live() bool
	// nodeBlocks is this node's NodeConfig spec.blocks and generation;
	// false when there is none.
	nodeBlocks() ([]coordinov1alpha1.NodeBlock, int64, bool)
	// nodeConfig is this node's NodeConfig to report status on; false when
	// the view has no object to write to.
	nodeConfig() (*coordinov1alpha1.NodeConfig, bool)
	// identities lists the cluster's Identity objects.
	identities() []*coordinov1alpha1.Identity
	// policy is everything policy is computed from, in no given order.
	policy() policy.Snapshot
	// namespaceLabels returns a namespace's labels; false when unknown.
	namespaceLabels(name string) (map[string]string, bool)
	// podLabels returns the labels of a pod of this node; false when
	// unknown or, given a UID, another pod of that name.
	podLabels(namespace, name, uid string) (map[string]string, bool)
	// pod returns a pod of this node as the API has it; false when unknown.
	pod(namespace, name string) (*corev1.Pod, bool)
	// namedPorts returns the named ports of this node's pods that have
	// some, by "namespace/name".
	namedPorts() map[string][]policy.NamedPort
	// state is the view to save as the last-known state; nil when there
	// is nothing newer than what is on disk.
	state() *lastKnown
}

// liveView reads the informers' listers.
type liveView struct {
	node   string
	pods   corelisters.PodLister
	nss    corelisters.NamespaceLister
	irs    coordinolisters.PolicyIRLister
	ncs    coordinolisters.NodeConfigLister
	idents coordinolisters.IdentityLister
	nips   coordinolisters.NodeIsolationPolicyLister
	cnps   cnplisters.ClusterNetworkPolicyLister
	nodes  corelisters.NodeLister
	// known is what the run started from: its blocks are saved again while
	// the node's NodeConfig is missing from the cache.
	known *lastKnown
}

var (
	_ view = (*liveView)(nil)
	_ view = (*lastKnown)(nil)
)

func (v *liveView) live() bool { return true }

func (v *liveView) nodeBlocks() ([]coordinov1alpha1.NodeBlock, int64, bool) {
	nc, ok := v.nodeConfig()
	if !ok {
		return nil, 0, false
	}
	return nc.Spec.Blocks, nc.Generation, true
}

func (v *liveView) nodeConfig() (*coordinov1alpha1.NodeConfig, bool) {
	nc, err := v.ncs.Get(v.node)
	return nc, err == nil
}

func (v *liveView) identities() []*coordinov1alpha1.Identity {
	objs, _ := v.idents.List(labels.Everything())
	return objs
}

func (v *liveView) policy() policy.Snapshot {
	var snap policy.Snapshot
	snap.PolicyIRs, _ = v.irs.List(labels.Everything())
	snap.ClusterPolicies, _ = v.cnps.List(labels.Everything())
	snap.Namespaces, _ = v.nss.List(labels.Everything())
	snap.NodeIsolation, _ = v.nips.List(labels.Everything())
	snap.Nodes, _ = v.nodes.List(labels.Everything())
	return snap
}

func (v *liveView) namespaceLabels(name string) (map[string]string, bool) {
	ns, err := v.nss.Get(name)
	if err != nil {
		return nil, false
	}
	return ns.Labels, true
}

func (v *liveView) podLabels(namespace, name, uid string) (map[string]string, bool) {
	p, ok := v.pod(namespace, name)
	if !ok || (uid != "" && string(p.UID) != uid) {
		return nil, false
	}
	return p.Labels, true
}

func (v *liveView) pod(namespace, name string) (*corev1.Pod, bool) {
	p, err := v.pods.Pods(namespace).Get(name)
	return p, err == nil
}

func (v *liveView) namedPorts() map[string][]policy.NamedPort {
	out := map[string][]policy.NamedPort{}
	pods, _ := v.pods.List(labels.Everything())
	for _, p := range pods {
		if ports := podNamedPorts(p); len(ports) > 0 {
			out[p.Namespace+"/"+p.Name] = ports
		}
	}
	return out
}

func (v *liveView) state() *lastKnown {
	lk := &lastKnown{Saved: time.Now().UTC(), Pods: map[string]knownPod{}, Namespaces: map[string]map[string]string{},
		Identities: map[string]coordinov1alpha1.IdentitySpec{}}
	if blocks, gen, ok := v.nodeBlocks(); ok {
		lk.Blocks, lk.Generation = blocks, gen
	} else if v.known != nil {
		lk.Blocks, lk.Generation = v.known.Blocks, v.known.Generation
	}
	pods, _ := v.pods.List(labels.Everything())
	for _, p := range pods {
		lk.Pods[p.Namespace+"/"+p.Name] = knownPod{UID: string(p.UID), Labels: p.Labels, NamedPorts: podNamedPorts(p)}
	}
	nss, _ := v.nss.List(labels.Everything())
	for _, ns := range nss {
		lk.Namespaces[ns.Name] = ns.Labels
	}
	lk.PolicyIRs, _ = v.irs.List(labels.Everything())
	lk.ClusterPolicies, _ = v.cnps.List(labels.Everything())
	lk.NodeIsolation, _ = v.nips.List(labels.Everything())
	lk.Nodes, _ = v.nodes.List(labels.Everything())
	for _, id := range v.identities() {
		lk.Identities[id.Name] = id.Spec
	}
	return lk
}

// The last-known state is the view before the informers sync; a nil one
// (no state saved) knows nothing.

func (lk *lastKnown) live() bool { return false }

func (lk *lastKnown) nodeBlocks() ([]coordinov1alpha1.NodeBlock, int64, bool) {
	if lk == nil {
		return nil, 0, false
	}
	return lk.Blocks, lk.Generation, true
}

// nodeConfig: status is written to the API server only.
func (lk *lastKnown) nodeConfig() (*coordinov1alpha1.NodeConfig, bool) { return nil, false }

func (lk *lastKnown) identities() []*coordinov1alpha1.Identity {
	if lk == nil {
		return nil
	}
	out := make([]*coordinov1alpha1.Identity, 0, len(lk.Identities))
	for name, spec := range lk.Identities {
		out = append(out, &coordinov1alpha1.Identity{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec})
	}
	return out
}

func (lk *lastKnown) policy() policy.Snapshot {
	var snap policy.Snapshot
	if lk == nil {
		return snap
	}
	snap.Policies, snap.PolicyIRs, snap.ClusterPolicies = lk.Policies, lk.PolicyIRs, lk.ClusterPolicies
	snap.NodeIsolation, snap.Nodes = lk.NodeIsolation, lk.Nodes
	for name, l := range lk.Namespaces {
		snap.Namespaces = append(snap.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}})
	}
	return snap
}

func (lk *lastKnown) namespaceLabels(name string) (map[string]string, bool) {
	if lk == nil {
		return nil, false
	}
	l, ok := lk.Namespaces[name]
	return l, ok
}

func (lk *lastKnown) podLabels(namespace, name, uid string) (map[string]string, bool) {
	if lk == nil {
		return nil, false
	}
	p, ok := lk.Pods[namespace+"/"+name]
	if !ok || (uid != "" && p.UID != uid) {
		return nil, false
	}
	return p.Labels, true
}

// pod: the last-known state keeps pods' labels and ports, not the objects.
func (lk *lastKnown) pod(string, string) (*corev1.Pod, bool) { return nil, false }

func (lk *lastKnown) namedPorts() map[string][]policy.NamedPort {
	out := map[string][]policy.NamedPort{}
	if lk == nil {
		return out
	}
	for key, p := range lk.Pods {
		if len(p.NamedPorts) > 0 {
			out[key] = p.NamedPorts
		}
	}
	return out
}

// state: the last-known state is what is on disk already.
func (lk *lastKnown) state() *lastKnown { return nil }
