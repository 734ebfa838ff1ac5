package controller

import (
	"context"
	"fmt"
	"sync"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinoinformers "github.com/coordino/coordino/api/client/informers/externalversions"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/api/policyir"
)

// Reasons of the Valid condition and of the Event on an invalid policy.
const (
	ReasonCompiled = "Compiled"
	ReasonInvalid  = "InvalidNetworkPolicy"
)

// PolicyCompiler keeps one PolicyIR per NetworkPolicy, same namespace and
// name, owned by it: the compiled spec, and a Valid condition (False with
// the validation error, also sent as a Warning Event on the NetworkPolicy).
// An invalid policy's PolicyIR isolates nothing, as the daemon skips it.
// Only the leader runs it, like every other writer of the controller.
type PolicyCompiler struct {
	log      *zap.Logger
	core     kubernetes.Interface
	crd      versioned.Interface
	recorder record.EventRecorder
	netpols  cache.Indexer
	irs      cache.Indexer
	queue    workqueue.TypedRateLimitingInterface[string]
}

// NewPolicyCompiler returns a compiler writing through crd; a nil recorder
// gets one of its own sending Events through core while Run runs.
func NewPolicyCompiler(log *zap.Logger, core kubernetes.Interface, crd versioned.Interface, recorder record.EventRecorder) *PolicyCompiler {
	return &PolicyCompiler{log: log.Named("policyir"), core: core, crd: crd, recorder: recorder,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "policyirs"})}
}

// Run watches NetworkPolicies and PolicyIRs and reconciles them with
// workers goroutines until ctx is done.
func (pc *PolicyCompiler) Run(ctx context.Context, workers int) error {
	defer pc.ensureRecorder()()
	kf := informers.NewSharedInformerFactory(pc.core, 0)
	cf := coordinoinformers.NewSharedInformerFactory(pc.crd, 0)
	nps := kf.Networking().V1().NetworkPolicies().Informer()
	irs := cf.Coordino().V1alpha1().PolicyIRs().Informer()
	pc.netpols, pc.irs = nps.GetIndexer(), irs.GetIndexer()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			pc.queue.Add(key)
		}
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue}
	for _, inf := range []cache.SharedIndexInformer{nps, irs} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return err
		}
	}
	kf.Start(ctx.Done())
	cf.Start(ctx.Done())
	defer kf.Shutdown()
	defer cf.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nps.HasSynced, irs.HasSynced) {
		return fmt.Errorf("policy caches did not sync: %w", ctx.Err())
	}
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() {
			for pc.processOne(ctx) {
			}
		})
	}
	<-ctx.Done()
	pc.queue.ShutDown()
	wg.Wait()
	return nil
}

// ensureRecorder gives the compiler its own Event recorder when it has
// none; the returned function stops it.
func (pc *PolicyCompiler) ensureRecorder() (stop func()) {
	if pc.recorder != nil {
		return func() {}
	}
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: pc.core.CoreV1().Events("")})
	pc.recorder = newEventRecorder(b)
	return b.Shutdown
}

// newEventRecorder returns the controller's Event recorder on b, knowing
// the core and coordino.io types it reports on.
func newEventRecorder(b record.EventBroadcaster) record.EventRecorder {
	sch := runtime.NewScheme()
	_ = scheme.AddToScheme(sch)
	_ = coordinov1alpha1.AddToScheme(sch)
	_ = cnpv1beta1.Install(sch)
	return b.NewRecorder(sch, corev1.EventSource{Component: "coordino-controller"})
}

func (pc *PolicyCompiler) processOne(ctx context.Context) bool {
	key, quit := pc.queue.Get()
	if quit {
		return false
	}
	defer pc.queue.Done(key)
	if err := pc.sync(ctx, key); err != nil {
		if ctx.Err() == nil {
			pc.log.Info("retrying", zap.String("key", key), zap.Error(err))
		}
		pc.queue.AddRateLimited(key)
		return true
	}
	pc.queue.Forget(key)
	return true
}

// sync makes the PolicyIR of key match its NetworkPolicy.
func (pc *PolicyCompiler) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	irs := pc.crd.CoordinoV1alpha1().PolicyIRs(ns)
	var old *coordinov1alpha1.PolicyIR
	if obj, ok, _ := pc.irs.GetByKey(key); ok {
		old = obj.(*coordinov1alpha1.PolicyIR)
	}
	obj, ok, _ := pc.netpols.GetByKey(key)
	if !ok {
		// Owner-reference garbage collection would do this too; deleting
		// here also works without kube-controller-manager and at once.
		if old == nil || !ownedByNetworkPolicy(old) {
			return nil
		}
		err := irs.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &old.UID}})
		countWrite("policyirs", "delete")
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	np := obj.(*networkingv1.NetworkPolicy)
	want, cond := compilePolicy(np)
	if old == nil {
		created, err := irs.Create(ctx, want, metav1.CreateOptions{})
		countWrite("policyirs", "create")
		if err != nil {
			return err
		}
		old = created
	} else if !equality.Semantic.DeepEqual(old.Spec, want.Spec) || !equality.Semantic.DeepEqual(old.OwnerReferences, want.OwnerReferences) {
		upd := old.DeepCopy()
		upd.Spec, upd.OwnerReferences = want.Spec, want.OwnerReferences
		if old, err = irs.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			countWrite("policyirs", "update")
			return err
		}
		countWrite("policyirs", "update")
	}
	prev := apimeta.FindStatusCondition(old.Status.Conditions, coordinov1alpha1.ConditionValid)
	if prev != nil && prev.Status == cond.Status && prev.Reason == cond.Reason && prev.Message == cond.Message &&
		prev.ObservedGeneration == cond.ObservedGeneration && old.Status.ObservedGeneration == np.Generation {
		return nil
	}
	if cond.Status == metav1.ConditionFalse && (prev == nil || prev.Message != cond.Message) {
		pc.recorder.Event(np, corev1.EventTypeWarning, ReasonInvalid, cond.Message)
	}
	upd := old.DeepCopy()
	upd.Status.ObservedGeneration = np.Generation
	apimeta.SetStatusCondition(&upd.Status.Conditions, cond)
	_, err = irs.UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	countWrite("policyirs/status", "update")
	return err
}

// compilePolicy returns the PolicyIR np should have and its Valid
// condition.
func compilePolicy(np *networkingv1.NetworkPolicy) (*coordinov1alpha1.PolicyIR, metav1.Condition) {
	yes := true
	out := &coordinov1alpha1.PolicyIR{ObjectMeta: metav1.ObjectMeta{Namespace: np.Namespace, Name: np.Name,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy",
			Name: np.Name, UID: np.UID, Controller: &yes}}}}
	cond := metav1.Condition{Type: coordinov1alpha1.ConditionValid, Status: metav1.ConditionTrue, Reason: ReasonCompiled,
		Message: "compiled", ObservedGeneration: np.Generation}
	spec, err := policyir.Compile(np)
	if err != nil {
		// Isolates nothing: the daemon also skips it by the condition.
		out.Spec = coordinov1alpha1.PolicyIRSpec{PodSelector: np.Spec.PodSelector, PolicyTypes: []string{}}
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonInvalid, err.Error()
		return out, cond
	}
	out.Spec = *spec
	if len(spec.Warnings) > 0 {
		cond.Message = fmt.Sprintf("compiled with warnings: %v", spec.Warnings)
	}
	return out, cond
}

func ownedByNetworkPolicy(o *coordinov1alpha1.PolicyIR) bool {
	for _, r := range o.OwnerReferences {
		if r.Kind == "NetworkPolicy" && r.APIVersion == "networking.k8s.io/v1" {
			return true
		}
	}
	return false
}

func countWrite(resource, verb string) { apiWrites.WithLabelValues(resource, verb).Inc() }
