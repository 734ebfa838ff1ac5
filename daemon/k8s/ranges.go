package k8s

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
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
}

// rangesDebounce gathers a burst of changes into one call.
const rangesDebounce = 200 * time.Millisecond

// WatchRanges calls onChange with the ranges once both informers synced
// and again after every change, until ctx is done. ServiceCIDRs are
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
	var listServices func() ([]netip.Prefix, error)
	if servesServiceCIDRs(kube, log) {
		coreInf := informers.NewSharedInformerFactory(kube, 0)
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
		coreInf.Start(ctx.Done())
	}
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
			r.sort()
			if last == nil || !r.equal(*last) {
				log.Info("cluster ranges", zap.Stringers("natOutgoing", r.NAT), zap.Stringers("noNATOutgoing", r.NoNAT), zap.Stringers("serviceCIDRs", r.Services))
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

func (r *Ranges) sort() {
	for _, ps := range []*[]netip.Prefix{&r.NAT, &r.NoNAT, &r.Services} {
		slices.SortFunc(*ps, func(a, b netip.Prefix) int { return strings.Compare(a.String(), b.String()) })
		*ps = slices.Compact(*ps)
	}
}

func (r Ranges) equal(o Ranges) bool {
	return slices.Equal(r.NAT, o.NAT) && slices.Equal(r.NoNAT, o.NoNAT) && slices.Equal(r.Services, o.Services)
}
