package k8s

import (
	"context"
	"net/netip"
	"slices"
	"sync"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/coordino/coordino/daemon/postdnat"
)

// portProto is a NodePort port and protocol some Service uses.
type portProto struct {
	proto uint8
	port  uint16
}

// NodePorts tracks the node ports kube-proxy translates on this node: each
// of the Node's addresses (InternalIP, ExternalIP) on each Service's
// nodePort. A Service event costs its own ports, a Node event its own
// addresses: the set is never recomputed from all Services. Changes go to
// apply as additions and removals once both informers synced; before,
// nothing is sent, and All gives the full set.
type NodePorts struct {
	mu     sync.Mutex
	ports  map[types.UID][]portProto // by Service
	refs   map[portProto]int         // Services using each
	addrs  []netip.Addr              // the Node's
	apply  func(add, del []postdnat.NodePort)
	synced bool
}

// NewNodePorts returns an empty tracker that sends changes to apply.
func NewNodePorts(apply func(add, del []postdnat.NodePort)) *NodePorts {
	return &NodePorts{ports: map[types.UID][]portProto{}, refs: map[portProto]int{}, apply: apply}
}

// All is the full set of deferred node ports.
func (n *NodePorts) All() []postdnat.NodePort {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.allLocked()
}

func (n *NodePorts) allLocked() []postdnat.NodePort {
	out := []postdnat.NodePort{}
	for pp := range n.refs {
		out = append(out, n.expand(n.addrs, []portProto{pp})...)
	}
	return out
}

// Synced starts sending changes.
func (n *NodePorts) Synced() {
	n.mu.Lock()
	n.synced = true
	n.mu.Unlock()
}

// With calls fn with the full set and whether it is synced, holding the
// tracker's lock: no change is sent while fn runs.
func (n *NodePorts) With(fn func(all []postdnat.NodePort, synced bool)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	fn(n.allLocked(), n.synced)
}

// SetService records svc's node ports (nil or a deleted Service: none).
func (n *NodePorts) SetService(uid types.UID, svc *corev1.Service) {
	var want []portProto
	if svc != nil {
		for _, p := range svc.Spec.Ports {
			if p.NodePort <= 0 || p.NodePort > 65535 {
				continue
			}
			proto, ok := map[corev1.Protocol]uint8{corev1.ProtocolTCP: 6, corev1.ProtocolUDP: 17, corev1.ProtocolSCTP: 132, "": 6}[p.Protocol]
			if ok {
				want = append(want, portProto{proto, uint16(p.NodePort)})
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var added, removed []portProto
	for _, pp := range want {
		if n.refs[pp]++; n.refs[pp] == 1 {
			added = append(added, pp)
		}
	}
	for _, pp := range n.ports[uid] {
		if n.refs[pp]--; n.refs[pp] == 0 {
			delete(n.refs, pp)
			removed = append(removed, pp)
		}
	}
	if len(want) == 0 {
		delete(n.ports, uid)
	} else {
		n.ports[uid] = want
	}
	n.send(n.expand(n.addrs, added), n.expand(n.addrs, removed))
}

// SetNodeAddresses records the Node's addresses.
func (n *NodePorts) SetNodeAddresses(addrs []netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var added, removed []netip.Addr
	for _, a := range addrs {
		if !slices.Contains(n.addrs, a) && !slices.Contains(added, a) {
			added = append(added, a)
		}
	}
	for _, a := range n.addrs {
		if !slices.Contains(addrs, a) {
			removed = append(removed, a)
		}
	}
	if len(added)+len(removed) == 0 {
		return
	}
	var all []portProto
	for pp := range n.refs {
		all = append(all, pp)
	}
	kept := make([]netip.Addr, 0, len(addrs))
	for _, a := range n.addrs {
		if !slices.Contains(removed, a) {
			kept = append(kept, a)
		}
	}
	n.addrs = append(kept, added...)
	n.send(n.expand(added, all), n.expand(removed, all))
}

func (n *NodePorts) expand(addrs []netip.Addr, pps []portProto) []postdnat.NodePort {
	var out []postdnat.NodePort
	for _, a := range addrs {
		for _, pp := range pps {
			out = append(out, postdnat.NodePort{Addr: a, Proto: pp.proto, Port: pp.port})
		}
	}
	return out
}

// send passes a change on once synced; callers hold mu, so changes arrive
// in order.
func (n *NodePorts) send(add, del []postdnat.NodePort) {
	if n.synced && len(add)+len(del) > 0 {
		n.apply(add, del)
	}
}

// nodeAddresses are a Node's InternalIP and ExternalIP addresses: those
// kube-proxy serves NodePorts on.
func nodeAddresses(node *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && !slices.Contains(out, ip.Unmap()) {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// WatchNodePorts feeds n from the API (all Services, and the Node named
// node) until ctx is done, and calls onSynced with the full set once both
// informers synced; changes follow through n's apply.
func WatchNodePorts(ctx context.Context, kube kubernetes.Interface, node string, n *NodePorts, onSynced func([]postdnat.NodePort), log *zap.Logger) {
	log = log.Named("nodeports")
	svcInf := informers.NewSharedInformerFactory(kube, 0)
	nodeInf := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", node).String()
	}))
	setSvc := func(obj any) {
		if s, ok := obj.(*corev1.Service); ok {
			n.SetService(s.UID, s)
		}
	}
	delSvc := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if s, ok := obj.(*corev1.Service); ok {
			n.SetService(s.UID, nil)
		}
	}
	setNode := func(obj any) {
		if nd, ok := obj.(*corev1.Node); ok && nd.Name == node {
			n.SetNodeAddresses(nodeAddresses(nd))
		}
	}
	var synced []cache.InformerSynced
	if reg, err := svcInf.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: setSvc, UpdateFunc: func(_, o any) { setSvc(o) }, DeleteFunc: delSvc,
	}); err == nil {
		synced = append(synced, reg.HasSynced)
	}
	if reg, err := nodeInf.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: setNode, UpdateFunc: func(_, o any) { setNode(o) },
		DeleteFunc: func(any) { n.SetNodeAddresses(nil) },
	}); err == nil {
		synced = append(synced, reg.HasSynced)
	}
	svcInf.Start(ctx.Done())
	nodeInf.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return
	}
	n.mu.Lock()
	n.synced = true
	all := n.allLocked()
	log.Info("node ports decided after DNAT", zap.Int("addresses", len(n.addrs)), zap.Int("ports", len(n.refs)))
	onSynced(all)
	n.mu.Unlock()
}
