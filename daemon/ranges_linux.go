package daemon

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/k8s"
	"github.com/coordino/coordino/daemon/postdnat"
)

// firstRangesWait bounds how long start-up waits for the API's Service
// ranges before the datapath opens with the flag's alone (the API is
// down): they are applied when they come.
const firstRangesWait = 5 * time.Second

// clusterRanges passes the API's IPPools and ServiceCIDR objects
// (k8s.WatchRanges) to the masquerade, and those with the Services'
// external and load-balancer addresses to the datapath's post-DNAT
// ranges. Standalone it only holds the flag's Service ranges.
type clusterRanges struct {
	o    *config.Options
	log  *zap.Logger
	masq *masq

	mu    sync.Mutex
	api   *k8s.Ranges // nil until the first from the API
	first chan struct{}
	dp    *datapath.Datapath
	// leftOut is how many external addresses the last services left out.
	leftOut int
	// nodePorts are this node's addresses on the Services' nodePorts
	// (Kubernetes mode). Its lock is taken before mu.
	nodePorts *k8s.NodePorts
}

// startRanges watches the API's ranges in Kubernetes mode.
func startRanges(ctx context.Context, o *config.Options, m *masq, log *zap.Logger) (*clusterRanges, error) {
	r := &clusterRanges{o: o, log: log.Named("ranges"), masq: m, first: make(chan struct{})}
	if o.Standalone {
		close(r.first)
		return r, nil
	}
	rc, err := k8s.RestConfig(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	crd, err := versioned.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	go k8s.WatchRanges(ctx, kube, crd, r.set, log)
	r.nodePorts = k8s.NewNodePorts(r.updateNodePorts)
	go k8s.WatchNodePorts(ctx, kube, o.NodeName, r.nodePorts, r.setNodePorts, log)
	return r, nil
}

// setNodePorts passes the API's full set of node ports to the datapath
// (once synced; later changes come by updateNodePorts).
func (r *clusterRanges) setNodePorts(all []postdnat.NodePort) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dp != nil {
		if err := r.dp.SetNodePorts(all); err != nil {
			r.log.Error("node ports decided after DNAT not updated", zap.Error(err))
		}
	}
}

// updateNodePorts passes one change of the node ports to the datapath.
func (r *clusterRanges) updateNodePorts(add, del []postdnat.NodePort) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dp != nil {
		if err := r.dp.UpdateNodePorts(add, del); err != nil {
			r.log.Error("node ports decided after DNAT not updated", zap.Error(err))
		}
	}
}

func (r *clusterRanges) set(got k8s.Ranges) {
	r.mu.Lock()
	firstTime := r.api == nil
	r.api = &got
	dp := r.dp
	r.mu.Unlock()
	if firstTime {
		close(r.first)
	}
	r.masq.setRanges(poolNAT{nat: got.NAT, exempt: got.NoNAT}, got.Services)
	if dp != nil {
		if err := dp.SetServiceCIDRs(r.services()); err != nil {
			r.log.Error("post-DNAT Service ranges not updated", zap.Error(err))
		}
	}
}

// services are the ranges whose new flows are decided after DNAT: the
// flag's Service ranges and the API's, then the Services' external and
// load-balancer addresses outside them, as many as the map holds (the
// ranges first: an address left out is judged before DNAT, as before).
func (r *clusterRanges) services() []netip.Prefix {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []netip.Prefix
	add := func(p netip.Prefix) {
		if !slices.Contains(out, p.Masked()) {
			out = append(out, p.Masked())
		}
	}
	for _, p := range r.o.ServicePrefixes {
		add(p)
	}
	if r.api == nil {
		return out
	}
	for _, p := range r.api.Services {
		add(p)
	}
	ranges := slices.Clone(out)
	left := 0
	for _, p := range r.api.External {
		if slices.ContainsFunc(ranges, func(s netip.Prefix) bool { return s.Contains(p.Addr()) }) {
			continue
		}
		if len(out) >= config.MaxServiceCIDRs {
			left++
			continue
		}
		add(p)
	}
	if left > 0 && left != r.leftOut {
		r.log.Warn("external and load-balancer addresses beyond the post-DNAT map's ranges: new flows to them are judged on the address, before DNAT",
			zap.Int("leftOut", left), zap.Int("capacity", config.MaxServiceCIDRs))
	}
	r.leftOut = left
	return out
}

// initialServices waits (a bounded time) for the API's first ranges and
// returns the Service ranges the datapath opens with.
func (r *clusterRanges) initialServices(ctx context.Context) []netip.Prefix {
	select {
	case <-r.first:
	case <-ctx.Done():
	case <-time.After(firstRangesWait):
		r.log.Warn("no Service ranges from the API yet: the datapath starts with --service-cidrs alone", zap.Duration("waited", firstRangesWait))
	}
	return r.services()
}

// bind sends later changes to dp, and what came since initialServices.
func (r *clusterRanges) bind(dp *datapath.Datapath) {
	if dp == nil {
		return
	}
	setDP := func(all []postdnat.NodePort, synced bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.dp = dp
		if synced {
			if err := dp.SetNodePorts(all); err != nil {
				r.log.Error("node ports decided after DNAT not updated", zap.Error(err))
			}
		}
	}
	if r.nodePorts != nil {
		// Under the tracker's lock: no change slips between its set and dp.
		r.nodePorts.With(setDP)
	} else {
		setDP(nil, false)
	}
	if err := dp.SetServiceCIDRs(r.services()); err != nil {
		r.log.Error("post-DNAT Service ranges not updated", zap.Error(err))
	}
}
