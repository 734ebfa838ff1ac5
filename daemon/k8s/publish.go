package k8s

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/identity"
)

// Publishing this node's endpoints.
const (
	// publishSettle lets a burst of ADDs and DELs land in one write.
	publishSettle = 200 * time.Millisecond
	// publishInterval is the least time between two writes: under churn a
	// node writes its object at most this often, whatever the pod rate.
	publishInterval = time.Second
	// publishResync re-checks the object now and then (a write that failed,
	// or an object someone else changed).
	publishResync = 30 * time.Second
)

// LocalEndpoint is a pod interface of this node as published.
type LocalEndpoint struct {
	PodNamespace, PodName string
	Addresses             []netip.Addr
	// Identity is the identity the datapath enforces for it.
	Identity identity.ID
}

// LocalEndpoints lists this node's endpoints.
type LocalEndpoints func() ([]LocalEndpoint, error)

// SetLocalEndpoints starts publishing this node's NodeEndpoints from list
// (until ctx ends); call PublishEndpoints whenever the list may have changed.
func (s *Source) SetLocalEndpoints(ctx context.Context, list LocalEndpoints) {
	go s.publishLoop(ctx, list)
	s.PublishEndpoints()
}

// PublishEndpoints asks for the NodeEndpoints object to be brought up to
// date soon. It never blocks: the datapath calls it under its lock.
func (s *Source) PublishEndpoints() {
	select {
	case s.publishKick <- struct{}{}:
	default:
	}
}

func (s *Source) publishLoop(ctx context.Context, list LocalEndpoints) {
	resync := time.NewTicker(publishResync)
	defer resync.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.publishKick:
		case <-resync.C:
		}
		wait := publishSettle
		if next := time.Until(last.Add(publishInterval)); next > wait {
			wait = next
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		v := s.view()
		if !v.live() {
			continue // nothing to compare with; the sync kicks again
		}
		eps, err := list()
		if err != nil {
			s.log.Warn("listing local endpoints to publish", zap.Error(err))
			continue
		}
		if wrote, err := s.publish(ctx, v, eps); err != nil {
			s.log.Warn("publishing NodeEndpoints (retried)", zap.Error(err))
			time.AfterFunc(publishInterval, s.PublishEndpoints)
		} else if wrote {
			last = time.Now()
		}
	}
}

// publish writes the node's object if it differs from spec.
func (s *Source) publish(ctx context.Context, v view, eps []LocalEndpoint) (bool, error) {
	spec := s.endpointsSpec(v, eps)
	cl := s.crd.CoordinoV1alpha1().NodeEndpoints()
	cur, err := s.inf.nodeEps.Get(s.cfg.NodeName)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch {
	case apierrors.IsNotFound(err):
		// Owned by the Node, so the API's garbage collector removes it with
		// the node even while the controller is down; and never created for
		// a Node that is gone (its object was just deleted with it).
		node, err := s.kube.CoreV1().Nodes().Get(wctx, s.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("node %s: %w", s.cfg.NodeName, err)
		}
		obj := &coordinov1alpha1.NodeEndpoints{ObjectMeta: metav1.ObjectMeta{Name: s.cfg.NodeName,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}}, Spec: spec}
		_, err = cl.Create(wctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return false, err // the informer has not shown it yet: next round updates it
		}
		s.m.endpointWrites.Inc()
		return err == nil, err
	case err != nil:
		return false, err
	case equality.Semantic.DeepEqual(cur.Spec, spec):
		return false, nil
	}
	upd := cur.DeepCopy()
	upd.Spec = spec
	_, err = cl.Update(wctx, upd, metav1.UpdateOptions{})
	s.m.endpointWrites.Inc()
	return err == nil, err
}

// endpointsSpec is what the node publishes: each endpoint that holds a
// cluster identity, with its pod's named ports, sorted by address. An
// endpoint still on a temporary identity is left out until it moves (the
// Identity informer re-attaches it, which kicks a publish).
func (s *Source) endpointsSpec(v view, eps []LocalEndpoint) coordinov1alpha1.NodeEndpointsSpec {
	var spec coordinov1alpha1.NodeEndpointsSpec
	for _, ep := range eps {
		if ep.Identity < identity.FirstPod || ep.Identity > identity.LastCluster || len(ep.Addresses) == 0 {
			continue
		}
		e := coordinov1alpha1.NodeEndpoint{Identity: int32(ep.Identity)}
		addrs := slices.Clone(ep.Addresses)
		slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
		for _, a := range addrs {
			e.Addresses = append(e.Addresses, a.String())
		}
		if len(e.Addresses) > 2 {
			e.Addresses = e.Addresses[:2]
		}
		if p, ok := v.pod(ep.PodNamespace, ep.PodName); ok {
			e.NamedPorts = namedPorts(p)
		}
		spec.Endpoints = append(spec.Endpoints, e)
	}
	slices.SortFunc(spec.Endpoints, func(a, b coordinov1alpha1.NodeEndpoint) int {
		return strings.Compare(a.Addresses[0], b.Addresses[0])
	})
	if len(spec.Endpoints) > coordinov1alpha1.MaxNodeEndpoints {
		s.log.Error("more endpoints than one NodeEndpoints object holds; the rest are not published",
			zap.Int("endpoints", len(spec.Endpoints)), zap.Int("limit", coordinov1alpha1.MaxNodeEndpoints))
		spec.Endpoints = spec.Endpoints[:coordinov1alpha1.MaxNodeEndpoints]
	}
	spec.EndpointCount = int32(len(spec.Endpoints))
	return spec
}

// namedPorts lists the pod's container ports that have a name (init
// containers' too: restartable ones serve traffic).
func namedPorts(p *corev1.Pod) []coordinov1alpha1.NamedPort {
	var out []coordinov1alpha1.NamedPort
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for _, c := range cs {
			for _, port := range c.Ports {
				if port.Name == "" || len(out) == 64 {
					continue
				}
				proto := string(port.Protocol)
				if proto == "" {
					proto = string(corev1.ProtocolTCP)
				}
				out = append(out, coordinov1alpha1.NamedPort{Name: port.Name, Protocol: proto, Port: port.ContainerPort})
			}
		}
	}
	return out
}
