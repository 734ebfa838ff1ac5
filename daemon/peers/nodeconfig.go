package peers

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	"github.com/coordino/coordino/api/client/informers/externalversions"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// NodeConfigs is the Kubernetes Source: an informer on NodeConfig objects
// (spec.blocks, status.addresses, status.wireGuard). Every event marks the
// set dirty; the set is rebuilt from the informer's cache, so bursts of
// events cost one apply.
type NodeConfigs struct {
	Client versioned.Interface
	Log    *zap.Logger
}

// Run implements Source.
func (s *NodeConfigs) Run(ctx context.Context, apply func(Set)) error {
	factory := externalversions.NewSharedInformerFactory(s.Client, 0)
	inf := factory.Coordino().V1alpha1().NodeConfigs()
	dirty := make(chan struct{}, 1)
	mark := func(any) {
		select {
		case dirty <- struct{}{}:
		default:
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: mark, DeleteFunc: mark, UpdateFunc: func(_, o any) { mark(o) },
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return ctx.Err()
	}
	var last Set
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-dirty:
		}
		list, err := inf.Lister().List(labels.Everything())
		if err != nil {
			return err
		}
		set := FromNodeConfigs(list, s.Log)
		if last != nil && equalSets(last, set) {
			continue
		}
		last = set
		apply(set)
		// Coalesce a burst (e.g. every node publishing its key at start-up).
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(debounce):
		}
	}
}

// FromNodeConfigs builds the set from NodeConfig objects. A node whose
// object does not validate is left out (logged), and of two nodes whose
// blocks overlap the later by name is, so one bad object cannot withdraw
// the routes of the rest.
func FromNodeConfigs(list []*coordinov1alpha1.NodeConfig, log *zap.Logger) Set {
	set := Set{}
	for _, nc := range list {
		n, err := FromNodeConfig(nc)
		if err != nil {
			log.Warn("NodeConfig left out of the peer set", zap.String("nodeConfig", nc.Name), zap.Error(err))
			continue
		}
		set[n.Name] = n
	}
	for {
		o, ok := set.firstOverlap()
		if !ok {
			return set
		}
		drop := max(o.a, o.b)
		log.Warn("NodeConfig left out of the peer set", zap.String("nodeConfig", drop), zap.Error(o))
		delete(set, drop)
	}
}

// FromNodeConfig converts one object; errors name the field.
func FromNodeConfig(nc *coordinov1alpha1.NodeConfig) (*Node, error) {
	n := &Node{Name: nc.Name}
	for _, s := range nc.Status.Addresses {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("status.addresses: %w", err)
		}
		if _, dup := n.Address(a.Is6()); dup {
			continue // one per family: the first is the one routed to
		}
		n.Addresses = append(n.Addresses, a)
	}
	for _, b := range nc.Spec.Blocks {
		p, err := netip.ParsePrefix(b.CIDR)
		if err != nil {
			return nil, fmt.Errorf("spec.blocks: %w", err)
		}
		// Releasing blocks still hold pods: they stay routed.
		n.Blocks = append(n.Blocks, p.Masked())
	}
	if wg := nc.Status.WireGuard; wg != nil && wg.PublicKey != "" {
		n.WireGuard = &WireGuard{PublicKey: wg.PublicKey}
		if wg.Endpoint != "" {
			ep, err := netip.ParseAddrPort(wg.Endpoint)
			if err != nil {
				return nil, fmt.Errorf("status.wireGuard.endpoint: %w", err)
			}
			n.WireGuard.Endpoint = ep
		}
	}
	if err := n.validate(); err != nil {
		return nil, err
	}
	return n, nil
}
