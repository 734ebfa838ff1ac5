package k8s

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinoinformers "github.com/coordino/coordino/api/client/informers/externalversions"
)

// Ranges are the cluster-wide address ranges that are neither policy nor
// blocks: what the IPPools say of NAT, and the Service ranges.
type Ranges struct {
	// NAT and NoNAT are the IPPools' CIDRs by spec.natOutgoing.
	NAT, NoNAT []netip.Prefix
	// Services are the ServiceCIDR objects' ranges (networking.k8s.io/v1,
	// Kubernetes 1.33+); empty where the API has none.
	Services []netip.Prefix
	// External are the Services' spec.externalIPs and
	// status.loadBalancer.ingress IPs, one host prefix each: kube-proxy
	// translates them as it does ClusterIPs.
	External []netip.Prefix
}

// rangesDebounce gathers a burst of changes into one call.
const rangesDebounce = 200 * time.Millisecond

// WatchRanges calls onChange with the ranges once the informers (IPPools,
// Services, ServiceCIDRs) synced and again after every change, until ctx
// is done. ServiceCIDRs are
// watched only where the API serves them (Kubernetes 1.33+); elsewhere
// Services stays empty and --service-cidrs alone says the ranges.
func WatchRanges(ctx context.Context, kube kubernetes.Interface, crd versioned.Interface, onChange func(Ranges), log *zap.Logger) {
	log = log.Named("ranges")
	crdInf := coordinoinformers.NewSharedInformerFactory(crd, 0)
	pools := crdInf.Coordino().V1alpha1().IPPools()
	dirty := make(chan struct{}, 1)
	mark := func(any) {
		select {
		case dirty <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: mark, DeleteFunc: mark, UpdateFunc: func(_, n any) { mark(n) }}
	synced := []cache.InformerSynced{}
	if reg, err := pools.Informer().AddEventHandler(h); err == nil {
		synced = append(synced, reg.HasSynced)
	}
	coreInf := informers.NewSharedInformerFactory(kube, 0)
	svcs := coreInf.Core().V1().Services()
	if reg, err := svcs.Informer().AddEventHandler(h); err == nil {
		synced = append(synced, reg.HasSynced)
	}
	var listServices func() ([]netip.Prefix, error)
	if servesServiceCIDRs(kube, log) {
		sc := coreInf.Networking().V1().ServiceCIDRs()
		if reg, err := sc.Informer().AddEventHandler(h); err == nil {
			synced = append(synced, reg.HasSynced)
		}
		listServices = func() ([]netip.Prefix, error) {
			objs, err := sc.Lister().List(labels.Everything())
			if err != nil {
				return nil, err
			}
			var out []netip.Prefix
			for _, o := range objs {
				for _, c := range o.Spec.CIDRs {
					p, err := netip.ParsePrefix(c)
					if err != nil {
						log.Warn("ServiceCIDR with an unparsable range skipped", zap.String("name", o.Name), zap.String("cidr", c), zap.Error(err))
						continue
					}
					out = append(out, p.Masked())
				}
			}
			return out, nil
		}
	}
	coreInf.Start(ctx.Done())
	crdInf.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return
	}
	var last *Ranges
	for {
		r := Ranges{}
		objs, err := pools.Lister().List(labels.Everything())
		if err == nil && listServices != nil {
			r.Services, err = listServices()
		}
		if err != nil {
			log.Error("listing IPPools and ServiceCIDRs", zap.Error(err))
		} else {
			for _, o := range objs {
				for _, c := range o.Spec.CIDRs {
					p, err := netip.ParsePrefix(c)
					if err != nil {
						log.Warn("IPPool with an unparsable CIDR skipped", zap.String("pool", o.Name), zap.String("cidr", c), zap.Error(err))
						continue
					}
					if o.Spec.NATOutgoing() {
						r.NAT = append(r.NAT, p.Masked())
					} else {
						r.NoNAT = append(r.NoNAT, p.Masked())
					}
				}
			}
			if objs, err := svcs.Lister().List(labels.Everything()); err == nil {
				r.External = externalAddresses(objs)
			}
			r.sort()
			if last == nil || !r.equal(*last) {
				log.Info("cluster ranges", zap.Stringers("natOutgoing", r.NAT), zap.Stringers("noNATOutgoing", r.NoNAT),
					zap.Stringers("serviceCIDRs", r.Services), zap.Int("externalAddresses", len(r.External)))
				onChange(r)
				last = &r
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-dirty:
			time.Sleep(rangesDebounce)
		}
	}
}

// servesServiceCIDRs reports whether the API serves networking.k8s.io/v1
// ServiceCIDRs.
func servesServiceCIDRs(kube kubernetes.Interface, log *zap.Logger) bool {
	res, err := kube.Discovery().ServerResourcesForGroupVersion("networking.k8s.io/v1")
	if err != nil {
		if !apierrors.IsNotFound(err) {
			log.Warn("API discovery failed: ServiceCIDR objects not watched, --service-cidrs alone says the Service ranges", zap.Error(err))
		}
		return false
	}
	for _, r := range res.APIResources {
		if r.Name == "servicecidrs" {
			return true
		}
	}
	log.Info("the API serves no ServiceCIDR (Kubernetes < 1.33): --service-cidrs alone says the Service ranges")
	return false
}

// externalAddresses are the Services' external and load-balancer IPs as
// host prefixes; what does not parse is skipped (the API validates both).
func externalAddresses(svcs []*corev1.Service) []netip.Prefix {
	var out []netip.Prefix
	add := func(s string) {
		if a, err := netip.ParseAddr(s); err == nil {
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	for _, svc := range svcs {
		for _, ip := range svc.Spec.ExternalIPs {
			add(ip)
		}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			add(in.IP)
		}
	}
	return out
}

func (r *Ranges) sort() {
	for _, ps := range []*[]netip.Prefix{&r.NAT, &r.NoNAT, &r.Services, &r.External} {
		slices.SortFunc(*ps, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
		*ps = slices.Compact(*ps)
	}
}

func (r Ranges) equal(o Ranges) bool {
	return slices.Equal(r.NAT, o.NAT) && slices.Equal(r.NoNAT, o.NoNAT) && slices.Equal(r.Services, o.Services) && slices.Equal(r.External, o.External)
}
