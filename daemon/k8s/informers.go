package k8s

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinoinformers "github.com/coordino/coordino/api/client/informers/externalversions"
	coordinolisters "github.com/coordino/coordino/api/client/listers/coordino/v1alpha1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	cnpinformers "sigs.k8s.io/network-policy-api/pkg/client/informers/externalversions"

	"github.com/coordino/coordino/daemon/policy"
)

// informerSet is the source's informers: the factories to start, what the
// first sync waits for, and the listers they fill.
type informerSet struct {
	factories []interface{ Start(stop <-chan struct{}) }
	hasSync   []cache.InformerSynced
	// live reads the listers; it is the source's view once they synced.
	live    *liveView
	nodeEps coordinolisters.NodeEndpointsLister
}

// newInformers registers the informers: this node's Pods and NodeConfig
// through factories filtered on the node, Namespaces, PolicyIRs,
// ClusterNetworkPolicies (normalized here, as in standalone mode),
// Identities, NodeIsolationPolicies, Nodes (their labels and addresses,
// for ClusterNetworkPolicy nodes peers) and every node's NodeEndpoints
// cluster-wide. Each kind's events mark what they make dirty; NodeEndpoints
// events go to remote.
//
// The sync waits for every handler to have seen every listed object, not
// only for the informers' stores: the first live apply confirms the remote
// endpoints restored at start and drops the rest, so one the remote handler
// had not passed on yet would be cut.
func newInformers(kube kubernetes.Interface, crd versioned.Interface, cnp cnpclient.Interface, node string, mark func(func(*dirtyBits)), remote cache.ResourceEventHandler) (*informerSet, error) {
	const resync = 0 // watches, no periodic relist
	coreInf := informers.NewSharedInformerFactory(kube, resync)
	podInf := informers.NewSharedInformerFactoryWithOptions(kube, resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}))
	crdInf := coordinoinformers.NewSharedInformerFactory(crd, resync)
	cnpInf := cnpinformers.NewSharedInformerFactory(cnp, resync)
	cnpI := cnpInf.Policy().V1beta1().ClusterNetworkPolicies()
	ncInf := coordinoinformers.NewSharedInformerFactoryWithOptions(crd, resync, coordinoinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", node).String()
	}))
	podI := podInf.Core().V1().Pods()
	nsI := coreInf.Core().V1().Namespaces()
	irI := crdInf.Coordino().V1alpha1().PolicyIRs()
	ncI := ncInf.Coordino().V1alpha1().NodeConfigs()
	idI := crdInf.Coordino().V1alpha1().Identities()
	nipI := crdInf.Coordino().V1alpha1().NodeIsolationPolicies()
	neI := crdInf.Coordino().V1alpha1().NodeEndpoints()
	nodeI := coreInf.Core().V1().Nodes()
	// Only the labels and addresses are kept: a Node's status is large
	// and rewritten often.
	if err := nodeI.Informer().SetTransform(policyNode); err != nil {
		return nil, err
	}
	set := &informerSet{
		factories: []interface{ Start(<-chan struct{}) }{coreInf, podInf, crdInf, ncInf, cnpInf},
		live: &liveView{node: node, pods: podI.Lister(), nss: nsI.Lister(), irs: irI.Lister(), ncs: ncI.Lister(),
			idents: idI.Lister(), nips: nipI.Lister(), cnps: cnpI.Lister(), nodes: nodeI.Lister()},
		nodeEps: neI.Lister(),
	}
	marking := func(f func(*dirtyBits)) cache.ResourceEventHandler {
		h := func(any) { mark(f) }
		return cache.ResourceEventHandlerFuncs{AddFunc: h, DeleteFunc: h, UpdateFunc: func(_, n any) { h(n) }}
	}
	for _, reg := range []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{podI.Informer(), marking(func(d *dirtyBits) { d.pods = true })},
		{nsI.Informer(), marking(func(d *dirtyBits) { d.policy, d.nsLbl = true, true })},
		{irI.Informer(), marking(func(d *dirtyBits) { d.policy = true })},
		{cnpI.Informer(), marking(func(d *dirtyBits) { d.policy = true })},
		{ncI.Informer(), marking(func(d *dirtyBits) { d.blocks = true })},
		{idI.Informer(), marking(func(d *dirtyBits) { d.identities = true })},
		{nipI.Informer(), marking(func(d *dirtyBits) { d.policy = true })},
		{nodeI.Informer(), nodeChanges(func() { mark(func(d *dirtyBits) { d.policy = true }) })},
		{neI.Informer(), remote},
	} {
		handled, err := reg.inf.AddEventHandler(reg.h)
		if err != nil {
			return nil, err
		}
		set.hasSync = append(set.hasSync, handled.HasSynced)
	}
	return set, nil
}

// start starts the informers until stop is closed.
func (set *informerSet) start(stop <-chan struct{}) {
	for _, f := range set.factories {
		f.Start(stop)
	}
}

// policyNode strips a Node to what policy reads: name, labels and the
// addresses nodes peers match.
func policyNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a tombstone
	}
	out := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels, ResourceVersion: n.ResourceVersion}}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
			out.Status.Addresses = append(out.Status.Addresses, a)
		}
	}
	return out, nil
}

// nodeChanges calls changed for a Node added or deleted, or updated in its
// labels or addresses; status heartbeats change nothing policy reads.
func nodeChanges(changed func()) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { changed() },
		DeleteFunc: func(any) { changed() },
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if !ok1 || !ok2 || !maps.Equal(on.Labels, nn.Labels) || !slices.Equal(policy.NodeAddrs(on), policy.NodeAddrs(nn)) {
				changed()
			}
		},
	}
}
