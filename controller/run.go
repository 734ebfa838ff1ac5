package controller

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinoinformers "github.com/coordino/coordino/api/client/informers/externalversions"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	cnpinformers "sigs.k8s.io/network-policy-api/pkg/client/informers/externalversions"
)

// LeaseName is the leader election Lease in Options.Namespace.
const LeaseName = "coordino-controller"

// RESTConfig returns the client configuration: the kubeconfig file when
// given, else the in-cluster service account.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}

// Run runs the controller until ctx is done or, with leader election, until
// this replica loses the lead (the caller exits and restarts: a former
// leader never writes again with stale caches).
func Run(ctx context.Context, cfg *rest.Config, opts Options, log *zap.Logger) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "coordino-controller"
	if opts.KubeAPIQPS > 0 {
		cfg.QPS = float32(opts.KubeAPIQPS)
	}
	if opts.KubeAPIBurst > 0 {
		cfg.Burst = opts.KubeAPIBurst
	}
	core, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	crd, err := versioned.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cnp, err := cnpclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	srv := newServer()
	if opts.MetricsAddr != "" {
		addr, err := srv.Serve(ctx, opts.MetricsAddr)
		if err != nil {
			return err
		}
		log.Info("serving metrics", zap.Stringer("addr", addr))
	}
	lead := func(ctx context.Context) error {
		isLeader.Set(1)
		defer isLeader.Set(0)
		return lead(ctx, opts, log, core, crd, cnp, dyn)
	}
	if !opts.LeaderElect {
		srv.SetReady(true)
		return lead(ctx)
	}
	id := opts.ID
	if id == "" {
		if id, err = os.Hostname(); err != nil {
			return err
		}
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaseName, Namespace: opts.Namespace},
		Client:     core.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	// A standby replica is ready: it serves health and takes over.
	srv.SetReady(true)
	// lead's goroutines must be gone before Run returns: wait for it
	// whenever it started.
	started, finished := make(chan struct{}), make(chan error, 1)
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   opts.LeaseDuration,
		RenewDeadline:   opts.RenewDeadline,
		RetryPeriod:     opts.RetryPeriod,
		ReleaseOnCancel: opts.ReleaseLease,
		Name:            LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				close(started)
				log.Info("leading", zap.String("id", id))
				finished <- lead(ctx)
				cancel()
			},
			OnStoppedLeading: func() { log.Info("stopped leading", zap.String("id", id)) },
			OnNewLeader: func(l string) {
				if l != id {
					log.Info("standing by", zap.String("leader", l))
				}
			},
		},
	})
	select {
	case <-started:
		if err := <-finished; err != nil {
			return err
		}
	default:
	}
	if parent.Err() != nil {
		return nil
	}
	return fmt.Errorf("lost the leader lease")
}

// lead starts informers and workers; it returns when ctx is done.
func lead(ctx context.Context, opts Options, log *zap.Logger, core kubernetes.Interface, crd versioned.Interface, cnp cnpclient.Interface, dyn dynamic.Interface) error {
	kf := informers.NewSharedInformerFactory(core, opts.ResyncPeriod)
	cf := coordinoinformers.NewSharedInformerFactory(crd, opts.ResyncPeriod)
	nodes := kf.Core().V1().Nodes().Informer()
	namespaces := kf.Core().V1().Namespaces().Informer()
	pods := kf.Core().V1().Pods().Informer()
	// 550k pods fit in memory only as the few fields used here.
	if err := pods.SetTransform(slimPod); err != nil {
		return err
	}
	pools := cf.Coordino().V1alpha1().IPPools().Informer()
	ncs := cf.Coordino().V1alpha1().NodeConfigs().Informer()
	blocks := cf.Coordino().V1alpha1().IPBlocks().Informer()
	idents := cf.Coordino().V1alpha1().Identities().Informer()
	// Policies only for the pod labels they select on (OnPolicyIR).
	irs := cf.Coordino().V1alpha1().PolicyIRs().Informer()
	pf := cnpinformers.NewSharedInformerFactory(cnp, opts.ResyncPeriod)
	cnps := pf.Policy().V1beta1().ClusterNetworkPolicies().Informer()
	stores := Stores{Nodes: nodes.GetIndexer(), Pods: pods.GetIndexer(), Namespaces: namespaces.GetIndexer(),
		IPPools: pools.GetIndexer(), NodeConfigs: ncs.GetIndexer(), IPBlocks: blocks.GetIndexer(), Identities: idents.GetIndexer()}
	c := New(opts, log, core, crd, stores)
	c.StartEvents(ctx)

	both := func(f func(any, bool)) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { f(o, false) },
			UpdateFunc: func(_, o any) { f(o, false) },
			DeleteFunc: func(o any) { f(o, true) },
		}
	}
	simple := func(f func(any)) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{AddFunc: f, UpdateFunc: func(_, o any) { f(o) }, DeleteFunc: f}
	}
	// The block, pool and identity indexes are built by these handlers, so
	// allocating starts once each handler has seen its informer's whole
	// list, not as soon as the stores are filled: a claim the block index
	// had not seen yet would give its node a second block.
	var handled []cache.InformerSynced
	for _, r := range []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{nodes, simple(c.OnNode)}, {ncs, simple(c.OnNodeConfig)}, {pools, both(c.OnIPPool)}, {blocks, both(c.OnIPBlock)},
		{namespaces, both(c.OnNamespace)}, {pods, both(c.OnPod)}, {idents, both(c.OnIdentity)},
		{irs, both(c.OnPolicyIR)}, {cnps, both(c.OnClusterPolicy)},
	} {
		reg, err := r.inf.AddEventHandler(r.h)
		if err != nil {
			return err
		}
		handled = append(handled, reg.HasSynced)
	}
	kf.Start(ctx.Done())
	cf.Start(ctx.Done())
	pf.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), handled...) {
		return fmt.Errorf("caches did not sync: %w", ctx.Err())
	}
	log.Info("caches synced; allocating")
	// Objects an older release stored as v1alpha1, rewritten once in the
	// storage version; beside the work, which reads them through either.
	migrated := make(chan struct{})
	go func() { migrateStorageUntilDone(ctx, dyn, log, 30*time.Second); close(migrated) }()
	policies, clusterPolicies := make(chan error, 1), make(chan error, 1)
	go func() { policies <- NewPolicyCompiler(log, core, crd, c.recorder).Run(ctx, opts.Workers) }()
	go func() { clusterPolicies <- NewClusterPolicyStatus(log, cnp, c.recorder).Run(ctx, opts.Workers) }()
	c.RunWorkers(ctx)
	if err := <-policies; err != nil && ctx.Err() == nil {
		log.Error("policy compiler", zap.Error(err))
	}
	if err := <-clusterPolicies; err != nil && ctx.Err() == nil {
		log.Error("clusternetworkpolicy status", zap.Error(err))
	}
	<-migrated
	kf.Shutdown()
	cf.Shutdown()
	pf.Shutdown()
	return nil
}

// slimPod keeps what blocks and identities need of a Pod.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, Labels: p.Labels, ResourceVersion: p.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status:     corev1.PodStatus{Phase: p.Status.Phase},
	}, nil
}
