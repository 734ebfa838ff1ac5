package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/bgp"
	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/k8s"
	"github.com/coordino/coordino/daemon/nodeaddrs"
	"github.com/coordino/coordino/daemon/peers"
	"github.com/coordino/coordino/daemon/routing"
)

// bgpPolicyPoll is how often Kubernetes mode re-reads the BGPPeerPolicies
// and the node's labels (a fabric's configuration changes rarely).
const bgpPolicyPoll = 10 * time.Second

// defaultBGPSecretNamespace holds the MD5 password Secrets unless
// POD_NAMESPACE names the daemon's own namespace.
const defaultBGPSecretNamespace = "coordino-system"

// bgpNode is --routing=bgp in the daemon: the speaker (started once the
// configuration is known: at once from --bgp-config, or from the node's
// BGPPeerPolicy in Kubernetes mode) and the node's own blocks and
// addresses it announces.
type bgpNode struct {
	o   *config.Options
	r   *routing.Router
	log *zap.Logger

	mu    sync.Mutex
	sp    *bgp.Speaker
	self  *peers.Node
	addrs []netip.Addr
	// applied is the spec last configured from the API (nil: none yet).
	applied *coordinov1alpha1.BGPPeerPolicySpec
	// services selects the Services announced (nil: none); svcKick wakes
	// the loop that follows them (Kubernetes mode).
	services labels.Selector
	svcKick  chan struct{}
	// cfg is the configuration the speaker last took, for a start after
	// the node left the fabric and came back (left).
	cfg  bgp.Config
	left bool
	// encrypted are the other nodes' blocks WireGuard carries (nil
	// without --encryption).
	encrypted []netip.Prefix
}

// startBGP starts the speaker from --bgp-config, or in Kubernetes mode
// without it follows the BGPPeerPolicy that selects this node.
func startBGP(ctx context.Context, o *config.Options, r *routing.Router, log *zap.Logger) (*bgpNode, error) {
	b := &bgpNode{o: o, r: r, log: log, svcKick: make(chan struct{}, 1)}
	addrs, err := nodeaddrs.List()
	if err != nil {
		return nil, fmt.Errorf("bgp: node addresses: %w", err)
	}
	b.addrs = addrs
	if o.BGPConfig != "" {
		cfg, err := bgp.FileConfig(o.BGPConfig)
		if err != nil {
			return nil, err
		}
		if err := b.configure(ctx, cfg); err != nil {
			return nil, err
		}
		if o.Standalone {
			return b, nil
		}
	}
	rc, err := k8s.RestConfig(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cl, err := versioned.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	if o.BGPConfig == "" {
		go b.followPolicies(ctx, cl, kube)
	}
	b.followServices(ctx, kube)
	b.followOwnNode(ctx, kube)
	return b, nil
}

func (b *bgpNode) speaker() *bgp.Speaker {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sp
}

// apply takes the peer set: only this node's entry matters (the others'
// blocks come from the fabric); the router keeps no peer routes, which
// removes what a direct run left.
func (b *bgpNode) apply(s peers.Set) error {
	b.mu.Lock()
	b.self = s[b.o.NodeName]
	b.mu.Unlock()
	return errors.Join(b.r.Apply(peers.Set{b.o.NodeName: s[b.o.NodeName]}), b.announce())
}

// applyEncrypted is apply with WireGuard (dev applies the set): the
// speaker announces this node's blocks and installs no learned route over
// another node's, which the device carries encrypted.
func (b *bgpNode) applyEncrypted(dev func(peers.Set) error) func(peers.Set) error {
	return func(s peers.Set) error {
		err := dev(s)
		var others []netip.Prefix
		for name, n := range s {
			if name != b.o.NodeName && n != nil {
				others = append(others, n.Blocks...)
			}
		}
		b.mu.Lock()
		b.self = s[b.o.NodeName]
		b.encrypted = others
		sp := b.sp
		b.mu.Unlock()
		if sp != nil {
			sp.SetEncrypted(others)
		}
		return errors.Join(err, b.announce())
	}
}

// announce gives the speaker, once running, the node's blocks (flags and
// peer set) and addresses.
func (b *bgpNode) announce() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sp == nil {
		return nil
	}
	blocks := slices.Clone(b.o.Prefixes)
	addrs := slices.Clone(b.addrs)
	if b.self != nil {
		blocks = append(blocks, b.self.Blocks...)
		addrs = append(addrs, b.self.Addresses...)
	}
	slices.SortFunc(blocks, netip.Prefix.Compare)
	return b.sp.SetLocal(slices.Compact(blocks), addrs, b.o.ServicePrefixes)
}

// configure starts the speaker with cfg, or reconfigures the running one.
func (b *bgpNode) configure(ctx context.Context, cfg bgp.Config) error {
	cfg.AwaitEncrypted = b.o.Encryption == "wireguard"
	b.mu.Lock()
	sp := b.sp
	b.services = cfg.Services
	b.cfg = cfg
	b.mu.Unlock()
	b.kickServices()
	if sp != nil {
		return sp.Configure(ctx, cfg)
	}
	var routerID netip.Addr
	for _, a := range b.addrs {
		if a.Is4() {
			routerID = a
			break
		}
	}
	sp, err := bgp.Start(ctx, cfg, b.o.NodeName, b.o.StateDir, routerID, b.log)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.sp = sp
	encrypted := b.encrypted
	b.mu.Unlock()
	if encrypted != nil {
		sp.SetEncrypted(encrypted)
	}
	return b.announce()
}

// followPolicies configures the speaker from the BGPPeerPolicy selecting
// this node, re-reading every bgpPolicyPoll. Until one selects it the node
// runs no speaker (and keeps what a previous run installed).
func (b *bgpNode) followPolicies(ctx context.Context, cl versioned.Interface, kube kubernetes.Interface) {
	ns := os.Getenv("POD_NAMESPACE")
	if ns == "" {
		ns = defaultBGPSecretNamespace
	}
	t := time.NewTicker(bgpPolicyPoll)
	defer t.Stop()
	for {
		if err := b.syncPolicy(ctx, cl, kube, ns); err != nil {
			b.log.Error("BGP configuration from the API not applied", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (b *bgpNode) syncPolicy(ctx context.Context, cl versioned.Interface, kube kubernetes.Interface, ns string) error {
	node, err := kube.CoreV1().Nodes().Get(ctx, b.o.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("node %s: %w", b.o.NodeName, err)
	}
	list, err := cl.CoordinoV1alpha1().BGPPeerPolicies().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list BGPPeerPolicies: %w", err)
	}
	pol, ignored := bgp.Select(list.Items, node.Labels)
	if pol == nil {
		b.mu.Lock()
		had := b.applied != nil
		b.mu.Unlock()
		if had {
			return fmt.Errorf("no BGPPeerPolicy selects node %s any more: the speaker keeps its last configuration until the daemon restarts", b.o.NodeName)
		}
		return nil
	}
	if len(ignored) > 0 {
		b.log.Warn("BGPPeerPolicies also select this node and are ignored", zap.String("policy", pol.Name), zap.Strings("ignored", ignored))
	}
	b.mu.Lock()
	same := b.applied != nil && reflect.DeepEqual(*b.applied, pol.Spec)
	b.mu.Unlock()
	if same {
		return nil
	}
	cfg, err := bgp.FromSpec(pol.Spec, func(p coordinov1alpha1.BGPPeer) (string, error) {
		if p.PasswordSecretRef == nil {
			return "", fmt.Errorf("passwordFile: only in --bgp-config; a BGPPeerPolicy takes passwordSecretRef")
		}
		sec, err := kube.CoreV1().Secrets(ns).Get(ctx, p.PasswordSecretRef.Name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("passwordSecretRef: Secret %s/%s: %w", ns, p.PasswordSecretRef.Name, err)
		}
		v, ok := sec.Data[p.PasswordSecretRef.Key]
		if !ok {
			return "", fmt.Errorf("passwordSecretRef: Secret %s/%s has no key %q", ns, p.PasswordSecretRef.Name, p.PasswordSecretRef.Key)
		}
		return string(v), nil
	})
	if err != nil {
		return fmt.Errorf("BGPPeerPolicy %s: %w", pol.Name, err)
	}
	if err := b.configure(ctx, cfg); err != nil {
		return fmt.Errorf("BGPPeerPolicy %s: %w", pol.Name, err)
	}
	spec := pol.Spec.DeepCopy()
	b.mu.Lock()
	b.applied = spec
	b.mu.Unlock()
	b.log.Info("BGP configured from BGPPeerPolicy", zap.String("policy", pol.Name), zap.Int("peers", len(cfg.Peers)))
	return nil
}

func (b *bgpNode) kickServices() {
	select {
	case b.svcKick <- struct{}{}:
	default:
	}
}

// followServices announces the addresses of the Services the
// configuration selects (bgp.ServiceRoutes), following Services and
// EndpointSlices: a Local Service's address comes and goes with this
// node's ready endpoints of it.
func (b *bgpNode) followServices(ctx context.Context, kube kubernetes.Interface) {
	f := informers.NewSharedInformerFactory(kube, 0)
	svcs := f.Core().V1().Services()
	eps := f.Discovery().V1().EndpointSlices()
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { b.kickServices() },
		UpdateFunc: func(any, any) { b.kickServices() },
		DeleteFunc: func(any) { b.kickServices() },
	}
	for _, inf := range []cache.SharedIndexInformer{svcs.Informer(), eps.Informer()} {
		if _, err := inf.AddEventHandler(h); err != nil {
			b.log.Error("BGP: Service addresses not followed", zap.Error(err))
			return
		}
	}
	f.Start(ctx.Done())
	go func() {
		f.WaitForCacheSync(ctx.Done())
		var last []netip.Prefix
		for {
			select {
			case <-ctx.Done():
				return
			case <-b.svcKick:
			}
			b.mu.Lock()
			sel, sp := b.services, b.sp
			b.mu.Unlock()
			if sp == nil {
				continue // configure kicks again once the speaker runs
			}
			all, err := svcs.Lister().List(labels.Everything())
			if err != nil {
				b.log.Error("BGP: list Services", zap.Error(err))
				continue
			}
			epSlices, err := eps.Lister().List(labels.Everything())
			if err != nil {
				b.log.Error("BGP: list EndpointSlices", zap.Error(err))
				continue
			}
			routes := bgp.ServiceRoutes(sel, all, bgp.ReadyHere(epSlices, b.o.NodeName))
			b.log.Debug("Service addresses to announce", zap.Int("services", len(all)), zap.Bool("selector", sel != nil), zap.Stringers("routes", routes))
			if reflect.DeepEqual(routes, last) {
				continue
			}
			if err := sp.SetServices(routes); err != nil {
				b.log.Error("BGP: Service addresses partly announced", zap.Error(err))
				continue
			}
			last = routes
		}
	}()
}

// followOwnNode watches this node's Node object. Deleted, the node is
// leaving the cluster, not restarting: the speaker leaves the fabric
// (bgp.Speaker.Leave, a Cease on every session), so the routers withdraw
// its blocks at once instead of keeping them as a restarting speaker's
// for the restart time. Created again (a node re-registering), the
// speaker starts afresh with the last configuration.
func (b *bgpNode) followOwnNode(ctx context.Context, kube kubernetes.Interface) {
	f := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", b.o.NodeName).String()
	}))
	if _, err := f.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { b.rejoin(ctx) },
		DeleteFunc: func(any) { b.leave() },
	}); err != nil {
		b.log.Error("BGP: this node's deletion not followed", zap.Error(err))
		return
	}
	f.Start(ctx.Done())
}

func (b *bgpNode) leave() {
	b.mu.Lock()
	sp := b.sp
	b.sp, b.left = nil, sp != nil
	b.mu.Unlock()
	if sp == nil {
		return
	}
	b.log.Info("node deleted: leaving the BGP fabric", zap.String("node", b.o.NodeName))
	if err := sp.Leave(); err != nil {
		b.log.Error("BGP: leaving the fabric", zap.Error(err))
	}
}

func (b *bgpNode) rejoin(ctx context.Context) {
	b.mu.Lock()
	left, cfg := b.left, b.cfg
	b.left = false
	b.mu.Unlock()
	if !left {
		return
	}
	b.log.Info("node created again: rejoining the BGP fabric", zap.String("node", b.o.NodeName))
	if err := b.configure(ctx, cfg); err != nil {
		b.log.Error("BGP: rejoining the fabric", zap.Error(err))
	}
}
