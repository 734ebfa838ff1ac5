package controller

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// Identities: the controller derives each pod's security label set
// (coordinov1alpha1.SecurityLabels), counts pods per set, and gives every
// set with pods an Identity. Numbers come from a cursor that only moves
// forward (persisted in a ConfigMap, reserved in batches), so a number is
// not handed out again until the range wraps, however long a node keeps
// using it after its Identity was collected. If two Identities carry the
// same set (two controllers overlapping), the lowest number is the set's
// identity and the other is collected as unused.

// labelSet is one distinct security label set with pods.
type labelSet struct {
	hash      string
	namespace string
	labels    map[string]string // kept until its Identity exists
	pods      int
}

type identRecord struct {
	hash        string
	uid         types.UID
	unusedSince time.Time
}

type podRecord struct {
	set  *labelSet
	node string
}

// identityIndex holds label sets, Identities and pods-per-node counts.
type identityIndex struct {
	mu         sync.Mutex
	sets       map[string]*labelSet
	byHash     map[string][]int // Identity numbers of a set, ascending
	idents     map[int]*identRecord
	pods       map[string]podRecord
	podsByNode map[string]int
	maxNumber  int
}

func newIdentityIndex() *identityIndex {
	return &identityIndex{sets: map[string]*labelSet{}, byHash: map[string][]int{}, idents: map[int]*identRecord{},
		pods: map[string]podRecord{}, podsByNode: map[string]int{}}
}

// holdsAddress says whether a pod may hold a pod-network address on its node.
func holdsAddress(p *corev1.Pod) bool {
	return !p.Spec.HostNetwork && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// accountPod updates the pod's label set and node counts and queues its
// set for an Identity when it has none.
func (c *Controller) accountPod(pod *corev1.Pod, deleted bool) {
	c.selMu.Lock()
	defer c.selMu.Unlock()
	c.accountPodLocked(pod, deleted)
}

// accountPodLocked is accountPod with c.selMu held.
func (c *Controller) accountPodLocked(pod *corev1.Pod, deleted bool) {
	key := pod.Namespace + "/" + pod.Name
	var hash string
	var lbls func() map[string]string
	node := ""
	if !deleted && holdsAddress(pod) {
		node = pod.Spec.NodeName
		if o, ok, _ := c.Namespaces.GetByKey(pod.Namespace); ok {
			nsLabels := o.(*corev1.Namespace).Labels
			excluded := c.excluded
			hash = coordinov1alpha1.SecurityLabelSetHash(pod.Namespace, pod.Labels, nsLabels, excluded)
			// Built only for a set seen for the first time.
			lbls = func() map[string]string {
				return coordinov1alpha1.SecurityLabels(pod.Labels, nsLabels, excluded)
			}
		}
		// Namespace not seen yet: OnNamespace accounts the pod later.
	}
	needs, oldNode := c.idents.setPod(key, hash, pod.Namespace, lbls, node, deleted)
	if needs {
		c.identQueue.Add(hash)
	}
	if oldNode != "" && oldNode != node {
		if _, exists, _ := c.Nodes.GetByKey(oldNode); !exists {
			c.nodeQueue.Add(oldNode) // a deleted node waits for its pods to go
		}
	}
}

// setPod moves a pod to a set (hash "" = none) and node; it reports
// whether the set still needs an Identity and the pod's previous node.
func (x *identityIndex) setPod(key, hash, namespace string, lbls func() map[string]string, node string, deleted bool) (bool, string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old, had := x.pods[key]
	if had && old.node == node && (old.set == nil && hash == "" || old.set != nil && old.set.hash == hash) {
		return false, old.node
	}
	if had {
		if old.set != nil {
			old.set.pods--
			if old.set.pods == 0 {
				delete(x.sets, old.set.hash)
			}
		}
		if old.node != "" {
			if x.podsByNode[old.node]--; x.podsByNode[old.node] == 0 {
				delete(x.podsByNode, old.node)
			}
		}
		delete(x.pods, key)
	}
	if deleted || hash == "" && node == "" {
		return false, old.node
	}
	rec := podRecord{node: node}
	if hash != "" {
		s := x.sets[hash]
		if s == nil {
			s = &labelSet{hash: hash, namespace: namespace}
			if len(x.byHash[hash]) == 0 {
				s.labels = lbls()
			}
			x.sets[hash] = s
		}
		s.pods++
		rec.set = s
	}
	if node != "" {
		x.podsByNode[node]++
	}
	x.pods[key] = rec
	return rec.set != nil && len(x.byHash[hash]) == 0, old.node
}

func (x *identityIndex) podsOn(node string) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.podsByNode[node]
}

// pending returns the set to allocate for, or nil when it has pods no more
// or has an Identity already.
func (x *identityIndex) pending(hash string) *labelSet {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.sets[hash]
	if s == nil || s.pods == 0 || len(x.byHash[hash]) > 0 || s.labels == nil {
		return nil
	}
	cp := *s
	return &cp
}

// addIdentity indexes an Identity object.
func (x *identityIndex) addIdentity(id *coordinov1alpha1.Identity) {
	n, err := strconv.Atoi(id.Name)
	if err != nil {
		return
	}
	hash := id.Labels[coordinov1alpha1.LabelSetHashLabel]
	if hash == "" {
		hash = coordinov1alpha1.LabelSetHash(id.Spec.Namespace, id.Spec.Labels)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.idents[n]; ok {
		return
	}
	x.idents[n] = &identRecord{hash: hash, uid: id.UID}
	nums := x.byHash[hash]
	i, _ := slices.BinarySearch(nums, n)
	x.byHash[hash] = slices.Insert(nums, i, n)
	if s := x.sets[hash]; s != nil {
		s.labels = nil // the Identity holds them now
	}
	x.maxNumber = max(x.maxNumber, n)
}

// removeIdentity forgets an Identity; it returns the hash of a set that
// has pods and no Identity left (to allocate again).
func (x *identityIndex) removeIdentity(id *coordinov1alpha1.Identity) string {
	n, err := strconv.Atoi(id.Name)
	if err != nil {
		return ""
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	rec, ok := x.idents[n]
	if !ok {
		return ""
	}
	delete(x.idents, n)
	nums := slices.DeleteFunc(x.byHash[rec.hash], func(v int) bool { return v == n })
	if len(nums) == 0 {
		delete(x.byHash, rec.hash)
		if s := x.sets[rec.hash]; s != nil && s.pods > 0 {
			s.labels = id.Spec.Labels
			return rec.hash
		}
		return ""
	}
	x.byHash[rec.hash] = nums
	return ""
}

func (x *identityIndex) exists(n int) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, ok := x.idents[n]
	return ok
}

// IdentityOf returns the Identity number of a label set, or 0.
func (c *Controller) IdentityOf(namespace string, labels map[string]string) int {
	x := c.idents
	x.mu.Lock()
	defer x.mu.Unlock()
	if nums := x.byHash[coordinov1alpha1.LabelSetHash(namespace, labels)]; len(nums) > 0 {
		return nums[0]
	}
	return 0
}

// syncIdentity creates the Identity of a label set (leader only: workers
// run only while leading).
func (c *Controller) syncIdentity(ctx context.Context, hash string) error {
	s := c.idents.pending(hash)
	if s == nil {
		return nil
	}
	for attempt := 0; attempt < 1000; attempt++ {
		n, err := c.alloc.take(ctx)
		if err != nil {
			return err
		}
		id := &coordinov1alpha1.Identity{
			ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(n), Labels: map[string]string{coordinov1alpha1.LabelSetHashLabel: hash}},
			Spec:       coordinov1alpha1.IdentitySpec{Namespace: s.namespace, Labels: s.labels},
		}
		out, err := c.crd.CoordinoV1alpha1().Identities().Create(ctx, id, metav1.CreateOptions{})
		c.writes.add("identities", "create")
		if apierrors.IsAlreadyExists(err) {
			continue // the name is the lock: someone has this number
		}
		if err != nil {
			return fmt.Errorf("create Identity %d: %w", n, err)
		}
		c.idents.addIdentity(out)
		_ = c.Identities.Update(out)
		identitiesAllocated.Inc()
		return nil
	}
	return fmt.Errorf("no free identity number after 1000 attempts")
}

// collectIdentities deletes Identities no pod has used for the grace
// period (and duplicates that lost to a lower number).
func (c *Controller) collectIdentities(ctx context.Context, now time.Time) {
	for _, v := range c.idents.unused(now, c.opts.IdentityGCGrace) {
		uid := v.uid
		err := c.crd.CoordinoV1alpha1().Identities().Delete(ctx, strconv.Itoa(v.number), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		c.writes.add("identities", "delete")
		if err != nil && !apierrors.IsNotFound(err) {
			c.log.Info("identity GC", zap.Int("identity", v.number), zap.Error(err))
			continue
		}
		c.idents.removeIdentity(&coordinov1alpha1.Identity{ObjectMeta: metav1.ObjectMeta{Name: strconv.Itoa(v.number)}})
		identitiesCollected.Inc()
	}
}

type unusedIdentity struct {
	number int
	uid    types.UID
}

// unused marks Identities that lost their pods and returns those unused
// for at least grace.
func (x *identityIndex) unused(now time.Time, grace time.Duration) []unusedIdentity {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []unusedIdentity
	for n, rec := range x.idents {
		s := x.sets[rec.hash]
		if s != nil && s.pods > 0 && x.byHash[rec.hash][0] == n {
			rec.unusedSince = time.Time{}
			continue
		}
		if rec.unusedSince.IsZero() {
			rec.unusedSince = now
		}
		if now.Sub(rec.unusedSince) >= grace {
			out = append(out, unusedIdentity{number: n, uid: rec.uid})
		}
	}
	return out
}

// allocatorConfigMap persists the identity number cursor.
const allocatorConfigMap = "coordino-identity-allocator"

// numberAllocator hands out identity numbers from batches reserved by
// advancing the cursor in the allocator ConfigMap (resourceVersion-checked),
// so numbers only move forward across restarts and leader changes.
type numberAllocator struct {
	c             *Controller
	mu            sync.Mutex
	cursor, limit int
}

func (a *numberAllocator) take(ctx context.Context) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		for a.cursor < a.limit {
			n := a.cursor
			a.cursor++
			if !a.c.idents.exists(n) {
				return n, nil
			}
		}
		if err := a.reserve(ctx); err != nil {
			return 0, err
		}
	}
}

func (a *numberAllocator) reserve(ctx context.Context) error {
	cms := a.c.core.CoreV1().ConfigMaps(a.c.opts.Namespace)
	for attempt := 0; attempt < 20; attempt++ {
		cm, err := cms.Get(ctx, allocatorConfigMap, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			a.c.idents.mu.Lock()
			start := max(a.c.idents.maxNumber+1, coordinov1alpha1.MinClusterIdentity)
			a.c.idents.mu.Unlock()
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: allocatorConfigMap, Namespace: a.c.opts.Namespace},
				Data: map[string]string{"next": strconv.Itoa(start)}}
			cm, err = cms.Create(ctx, cm, metav1.CreateOptions{})
			a.c.writes.add("configmaps", "create")
			if apierrors.IsAlreadyExists(err) {
				continue
			}
		}
		if err != nil {
			return fmt.Errorf("identity allocator ConfigMap: %w", err)
		}
		start, err := strconv.Atoi(cm.Data["next"])
		if err != nil || start < coordinov1alpha1.MinClusterIdentity || start > coordinov1alpha1.MaxClusterIdentity {
			start = coordinov1alpha1.MinClusterIdentity
		}
		end := min(start+a.c.opts.IdentityBatch, coordinov1alpha1.MaxClusterIdentity+1)
		next := end
		if next > coordinov1alpha1.MaxClusterIdentity {
			next = coordinov1alpha1.MinClusterIdentity // wrap: only now can numbers come back
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data["next"] = strconv.Itoa(next)
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		a.c.writes.add("configmaps", "update")
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("identity allocator ConfigMap: %w", err)
		}
		a.cursor, a.limit = start, end
		return nil
	}
	return fmt.Errorf("identity allocator ConfigMap: too many conflicts")
}
