package controller

import (
	"net/netip"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/api/policyir"
)

// Event handlers. Each takes the object as the informer delivers it (the
// store is already updated) and enqueues only what the change concerns.

// poolStatusDelay coalesces the pool status writes of a burst of claims.
const poolStatusDelay = time.Second

// OnNode handles a Node add, update or delete.
func (c *Controller) OnNode(obj any) {
	if n, ok := metaName(obj); ok {
		c.nodeQueue.Add(n)
	}
}

// OnNodeConfig handles a NodeConfig change (daemon status reports).
func (c *Controller) OnNodeConfig(obj any) {
	if n, ok := metaName(obj); ok {
		c.nodeQueue.Add(n)
	}
}

// OnIPBlock keeps the block index in step with claims, including other
// controllers' (overlap across a leader change).
func (c *Controller) OnIPBlock(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	b, ok := obj.(*coordinov1alpha1.IPBlock)
	if !ok {
		return
	}
	p, err := coordinov1alpha1.ParseCIDR("spec.cidr", b.Spec.CIDR)
	if err != nil {
		c.log.Warn("ignoring IPBlock", zap.String("name", b.Name), zap.Error(err))
		return
	}
	if deleted {
		c.blocks.remove(p, b.UID)
		c.blockFreed(b.Spec.Pool)
	} else {
		c.blocks.set(p, blockHolder{node: b.Spec.Node, pool: b.Spec.Pool, phase: b.Spec.Phase, uid: b.UID})
	}
	c.nodeQueue.Add(b.Spec.Node)
	c.poolQueue.AddAfter(b.Spec.Pool, poolStatusDelay)
}

// OnIPPool reloads a pool's ranges and revisits every node (pool changes
// are rare; node events never scan).
func (c *Controller) OnIPPool(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	pool, ok := obj.(*coordinov1alpha1.IPPool)
	if !ok {
		return
	}
	if deleted {
		c.blocks.setRanges(pool.Name, nil, nil)
	} else if prefixes, err := c.poolPrefixes(pool); err != nil {
		c.recorder.Eventf(pool, corev1.EventTypeWarning, "InvalidPool", "%v", err)
		c.blocks.setRanges(pool.Name, nil, nil)
	} else {
		c.blocks.setRanges(pool.Name, prefixes, func(p netip.Prefix) int { return pool.Spec.BlockSize(p.Addr().Is6()) })
		c.poolQueue.AddAfter(pool.Name, poolStatusDelay)
	}
	for _, n := range c.Nodes.ListKeys() {
		c.nodeQueue.Add(n)
	}
}

// poolPrefixes parses a pool and refuses CIDRs that overlap an older pool.
func (c *Controller) poolPrefixes(pool *coordinov1alpha1.IPPool) ([]netip.Prefix, error) {
	prefixes, err := pool.Spec.Prefixes()
	if err != nil {
		return nil, err
	}
	for _, o := range c.IPPools.List() {
		other := o.(*coordinov1alpha1.IPPool)
		if other.Name == pool.Name || !olderPool(other, pool) {
			continue
		}
		ops, err := other.Spec.Prefixes()
		if err != nil {
			continue
		}
		for _, p := range prefixes {
			for _, q := range ops {
				if p.Overlaps(q) {
					return nil, errOverlap(pool.Name, p, other.Name, q)
				}
			}
		}
	}
	return prefixes, nil
}

func olderPool(a, b *coordinov1alpha1.IPPool) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// OnPod keeps pod counts per node and label-set reference counts.
func (c *Controller) OnPod(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	c.accountPod(pod, deleted)
}

// OnNamespace re-derives the label sets of the namespace's pods when its
// labels change (the namespace's labels are part of every set).
func (c *Controller) OnNamespace(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return
	}
	pods, _ := c.Pods.ByIndex(cache.NamespaceIndex, ns.Name)
	for _, o := range pods {
		c.accountPod(o.(*corev1.Pod), false)
	}
}

// OnIdentity indexes cluster Identities (ours and other controllers').
func (c *Controller) OnIdentity(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	id, ok := obj.(*coordinov1alpha1.Identity)
	if !ok {
		return
	}
	if deleted {
		if hash := c.idents.removeIdentity(id); hash != "" {
			c.identQueue.Add(hash)
		}
		return
	}
	c.idents.addIdentity(id)
}

func metaName(obj any) (string, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, ok := obj.(metav1.Object)
	if !ok {
		return "", false
	}
	return m.GetName(), true
}

// setWaiting records that node needs a block from pool and has none.
func (c *Controller) setWaiting(pool, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.waiting[pool]
	if w == nil {
		w = map[string]struct{}{}
		c.waiting[pool] = w
		c.poolQueue.Add(pool)
	}
	w[node] = struct{}{}
}

// doneWaiting clears node from every pool's waiters (it has what it needs
// or is gone).
func (c *Controller) doneWaiting(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for pool, w := range c.waiting {
		if _, ok := w[node]; !ok {
			continue
		}
		delete(w, node)
		if len(w) == 0 {
			delete(c.waiting, pool)
			c.poolQueue.Add(pool)
		}
	}
}

// blockFreed revisits the nodes waiting on the pool.
func (c *Controller) blockFreed(pool string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for n := range c.waiting[pool] {
		c.nodeQueue.Add(n)
	}
}

func (c *Controller) isExhausted(pool string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiting[pool]) > 0
}

// OnPolicyIR and OnClusterPolicy track the excluded pod labels policies
// select on (policyir.SelectedLabels): a key that becomes selected, or
// stops being, re-derives the label sets of the pods carrying it, and
// only theirs.
func (c *Controller) OnPolicyIR(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	ir, ok := obj.(*coordinov1alpha1.PolicyIR)
	if !ok {
		return
	}
	var names func(func(string))
	if !deleted {
		names = func(add func(string)) { policyir.PodLabelKeys(&ir.Spec, add) }
	}
	c.setSelected(policyir.PolicyIRKey(ir.Namespace, ir.Name), names)
}

// OnClusterPolicy: see OnPolicyIR.
func (c *Controller) OnClusterPolicy(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	cnp, ok := obj.(*cnpv1beta1.ClusterNetworkPolicy)
	if !ok {
		return
	}
	var names func(func(string))
	if !deleted {
		names = func(add func(string)) { policyir.ClusterPodLabelKeys(cnp, add) }
	}
	c.setSelected(policyir.ClusterPolicyKey(cnp.Name), names)
}

func (c *Controller) setSelected(key string, names func(func(string))) {
	c.selMu.Lock()
	defer c.selMu.Unlock()
	changed := c.selected.Set(key, names)
	if len(changed) == 0 {
		return
	}
	c.excluded = c.selected.Excluded()
	c.log.Info("pod labels selected by policies changed", zap.Strings("keys", changed), zap.Strings("excluded", c.excluded))
	// A listing of the pods, but new label sets only for those carrying
	// a changed key; a key changes only with the first or last policy
	// naming it.
	for _, o := range c.Pods.List() {
		pod := o.(*corev1.Pod)
		for _, k := range changed {
			if _, ok := pod.Labels[k]; ok {
				c.accountPodLocked(pod, false)
				break
			}
		}
	}
}
