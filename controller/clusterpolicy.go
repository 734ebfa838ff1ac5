package controller

import (
	"context"
	"fmt"
	"sync"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	cnpinformers "sigs.k8s.io/network-policy-api/pkg/client/informers/externalversions"

	"github.com/coordino/coordino/api/policyir"
)

// Condition of a ClusterNetworkPolicy's status and the reasons of it and
// of the Warning Event on an invalid one.
const (
	ConditionAccepted           = "Accepted"
	ReasonClusterPolicyAccepted = "Accepted"
	ReasonClusterPolicyInvalid  = "InvalidClusterNetworkPolicy"
)

// ClusterPolicyStatus checks every ClusterNetworkPolicy with the normalizer
// the daemons enforce it with (policyir.NormalizeCluster) and reports the
// result in its status: Accepted True (with the warnings of parts that
// match nothing or fail closed), or False with the error naming the field,
// which also goes out as a Warning Event. Daemons read the policies
// themselves; an invalid one is enforced nowhere.
type ClusterPolicyStatus struct {
	log      *zap.Logger
	client   cnpclient.Interface
	recorder record.EventRecorder
	cnps     cache.Indexer
	queue    workqueue.TypedRateLimitingInterface[string]
}

// NewClusterPolicyStatus returns a reconciler writing through client.
func NewClusterPolicyStatus(log *zap.Logger, client cnpclient.Interface, recorder record.EventRecorder) *ClusterPolicyStatus {
	return &ClusterPolicyStatus{log: log.Named("clusternetworkpolicy"), client: client, recorder: recorder,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "clusternetworkpolicies"})}
}

// Run watches ClusterNetworkPolicies until ctx is done.
func (cs *ClusterPolicyStatus) Run(ctx context.Context, workers int) error {
	f := cnpinformers.NewSharedInformerFactory(cs.client, 0)
	inf := f.Policy().V1beta1().ClusterNetworkPolicies().Informer()
	cs.cnps = inf.GetIndexer()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			cs.queue.Add(key)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("clusternetworkpolicy cache did not sync: %w", ctx.Err())
	}
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() {
			for cs.processOne(ctx) {
			}
		})
	}
	<-ctx.Done()
	cs.queue.ShutDown()
	wg.Wait()
	return nil
}

func (cs *ClusterPolicyStatus) processOne(ctx context.Context) bool {
	key, quit := cs.queue.Get()
	if quit {
		return false
	}
	defer cs.queue.Done(key)
	if err := cs.sync(ctx, key); err != nil {
		if ctx.Err() == nil {
			cs.log.Info("retrying", zap.String("key", key), zap.Error(err))
		}
		cs.queue.AddRateLimited(key)
		return true
	}
	cs.queue.Forget(key)
	return true
}

// clusterPolicyCondition is the Accepted condition cnp should carry.
func clusterPolicyCondition(cnp *cnpv1beta1.ClusterNetworkPolicy) metav1.Condition {
	cond := metav1.Condition{Type: ConditionAccepted, Status: metav1.ConditionTrue, Reason: ReasonClusterPolicyAccepted,
		Message: "enforced by every node", ObservedGeneration: cnp.Generation}
	p, err := policyir.NormalizeCluster(cnp)
	switch {
	case err != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonClusterPolicyInvalid, err.Error()
	case len(p.Warnings) > 0:
		cond.Message = fmt.Sprintf("enforced with warnings: %v", p.Warnings)
	}
	return cond
}

// sync brings the status of one ClusterNetworkPolicy up to date.
func (cs *ClusterPolicyStatus) sync(ctx context.Context, key string) error {
	obj, ok, _ := cs.cnps.GetByKey(key)
	if !ok {
		return nil
	}
	cnp := obj.(*cnpv1beta1.ClusterNetworkPolicy)
	cond := clusterPolicyCondition(cnp)
	prev := apimeta.FindStatusCondition(cnp.Status.Conditions, ConditionAccepted)
	if prev != nil && prev.Status == cond.Status && prev.Reason == cond.Reason && prev.Message == cond.Message &&
		prev.ObservedGeneration == cond.ObservedGeneration {
		return nil
	}
	if cond.Status == metav1.ConditionFalse && (prev == nil || prev.Message != cond.Message) {
		cs.recorder.Event(cnp, corev1.EventTypeWarning, ReasonClusterPolicyInvalid, cond.Message)
	}
	upd := cnp.DeepCopy()
	apimeta.SetStatusCondition(&upd.Status.Conditions, cond)
	_, err := cs.client.PolicyV1beta1().ClusterNetworkPolicies().UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	countWrite("clusternetworkpolicies/status", "update")
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
