package controller

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	"github.com/coordino/coordino/api/policyir"
)

// Stores are the object caches the controller reads; Run fills them with
// informers (tests and the benchmark may fill them directly).
type Stores struct {
	Nodes, Pods, Namespaces                    cache.Indexer
	IPPools, NodeConfigs, IPBlocks, Identities cache.Indexer
}

// NewStores returns empty stores with the indexes the controller uses.
func NewStores() Stores {
	ns := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	idx := func(i cache.Indexers) cache.Indexer { return cache.NewIndexer(cache.MetaNamespaceKeyFunc, i) }
	return Stores{
		Nodes: idx(nil), Pods: idx(ns), Namespaces: idx(nil),
		IPPools: idx(nil), NodeConfigs: idx(nil), IPBlocks: idx(nil), Identities: idx(nil),
	}
}

// Controller allocates blocks and identities. Create it with New, feed it
// events through the On* handlers (Run wires informers to them) and run its
// workers with RunWorkers.
type Controller struct {
	opts     Options
	log      *zap.Logger
	core     kubernetes.Interface
	crd      versioned.Interface
	recorder record.EventRecorder
	Stores

	blocks     *blockIndex
	idents     *identityIndex
	alloc      *numberAllocator
	writes     *writeCounter
	nodeQueue  workqueue.TypedRateLimitingInterface[string]
	poolQueue  workqueue.TypedRateLimitingInterface[string]
	identQueue workqueue.TypedRateLimitingInterface[string]

	// selected counts the policies naming each excluded label; excluded
	// is what identities leave out now. selMu also orders pod accounting
	// with a change of them, so no pod keeps a set of the old exclusion.
	selMu    sync.Mutex
	selected *policyir.SelectedLabels
	excluded []string

	mu         sync.Mutex
	waiting    map[string]map[string]struct{} // pool -> nodes that found it exhausted
	emptySince map[netip.Prefix]time.Time
	broadcast  record.EventBroadcaster
}

// New returns a controller writing through core and crd.
func New(opts Options, log *zap.Logger, core kubernetes.Interface, crd versioned.Interface, stores Stores) *Controller {
	b := record.NewBroadcaster()
	c := &Controller{
		opts: opts, log: log, core: core, crd: crd, Stores: stores,
		recorder:   newEventRecorder(b),
		broadcast:  b,
		blocks:     newBlockIndex(),
		idents:     newIdentityIndex(),
		writes:     newWriteCounter(),
		waiting:    map[string]map[string]struct{}{},
		emptySince: map[netip.Prefix]time.Time{},
		nodeQueue: workqueue.NewTypedRateLimitingQueueWithConfig(retryLimiter(),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "nodes"}),
		poolQueue: workqueue.NewTypedRateLimitingQueueWithConfig(retryLimiter(),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "pools"}),
		identQueue: workqueue.NewTypedRateLimitingQueueWithConfig(retryLimiter(),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "identities"}),
	}
	c.alloc = &numberAllocator{c: c}
	c.selected = policyir.NewSelectedLabels(opts.ExcludedLabels)
	c.excluded = opts.ExcludedLabels
	return c
}

// maxRetryDelay caps the back-off of a failing key. client-go's default
// grows to 1000 s: a node whose sync failed a dozen times in a row (two
// replicas overlapping, conflicts on caches lagging under load) would wait
// minutes for its first block although the next attempt would succeed.
const maxRetryDelay = 5 * time.Second

// retryLimiter is client-go's default controller limiter (per-key
// exponential back-off, overall token bucket) with the per-key delay capped
// at maxRetryDelay.
func retryLimiter() workqueue.TypedRateLimiter[string] {
	return workqueue.NewTypedMaxOfRateLimiter(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](5*time.Millisecond, maxRetryDelay),
		&workqueue.TypedBucketRateLimiter[string]{Limiter: rate.NewLimiter(rate.Limit(10), 100)},
	)
}

// StartEvents sends Events to the API server until ctx is done.
func (c *Controller) StartEvents(ctx context.Context) {
	c.broadcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.core.CoreV1().Events("")})
	go func() { <-ctx.Done(); c.broadcast.Shutdown() }()
}

// RunWorkers processes the queues until ctx is done; the identity garbage
// collector runs alongside.
func (c *Controller) RunWorkers(ctx context.Context) {
	var wg sync.WaitGroup
	run := func(q workqueue.TypedRateLimitingInterface[string], sync func(context.Context, string) error, n int) {
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for c.processOne(ctx, q, sync) {
				}
			}()
		}
	}
	run(c.nodeQueue, c.syncNode, c.opts.Workers)
	run(c.poolQueue, c.syncPoolStatus, 1)
	// One identity worker: numbers come from one allocator in order.
	run(c.identQueue, c.syncIdentity, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(c.opts.IdentityGCPeriod)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				c.collectIdentities(ctx, time.Now())
			}
		}
	}()
	<-ctx.Done()
	c.nodeQueue.ShutDown()
	c.poolQueue.ShutDown()
	c.identQueue.ShutDown()
	wg.Wait()
}

func (c *Controller) processOne(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], sync func(context.Context, string) error) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	if err := sync(ctx, key); err != nil {
		if ctx.Err() == nil {
			c.log.Info("retrying", zap.String("key", key), zap.Error(err))
		}
		q.AddRateLimited(key)
		return true
	}
	q.Forget(key)
	return true
}

// Drain processes queued work on the calling goroutine until every queue
// is empty (the benchmark's simulation, where nothing runs concurrently).
func (c *Controller) Drain(ctx context.Context) error {
	for {
		progressed := false
		for _, w := range []struct {
			q    workqueue.TypedRateLimitingInterface[string]
			sync func(context.Context, string) error
		}{{c.nodeQueue, c.syncNode}, {c.identQueue, c.syncIdentity}, {c.poolQueue, c.syncPoolStatus}} {
			for w.q.Len() > 0 {
				key, _ := w.q.Get()
				err := w.sync(ctx, key)
				w.q.Done(key)
				w.q.Forget(key)
				if err != nil {
					return fmt.Errorf("%s: %w", key, err)
				}
				progressed = true
			}
		}
		if !progressed {
			return nil
		}
	}
}

// Writes returns the API writes made so far, by "resource verb".
func (c *Controller) Writes() map[string]int64 { return c.writes.snapshot() }

type writeCounter struct {
	mu sync.Mutex
	n  map[string]int64
}

func newWriteCounter() *writeCounter { return &writeCounter{n: map[string]int64{}} }

func (w *writeCounter) add(resource, verb string) {
	w.mu.Lock()
	w.n[resource+" "+verb]++
	w.mu.Unlock()
	apiWrites.WithLabelValues(resource, verb).Inc()
}

func (w *writeCounter) snapshot() map[string]int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int64, len(w.n))
	for k, v := range w.n {
		out[k] = v
	}
	return out
}
