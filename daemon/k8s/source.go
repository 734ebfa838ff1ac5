package k8s

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinoinformers "github.com/coordino/coordino/api/client/informers/externalversions"
	coordinolisters "github.com/coordino/coordino/api/client/listers/coordino/v1alpha1"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/controlplane"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/daemon/store"
)

// Defaults of Config's durations.
const (
	// DefaultPodWait bounds how long an ADD waits for its pod to reach the
	// informer cache (the pod is usually there long before the runtime
	// calls CNI; this covers a watch lagging by a moment).
	DefaultPodWait = 2 * time.Second
	// DefaultSyncWait is how long start-up waits for the API server before
	// serving from the last-known state.
	DefaultSyncWait = 5 * time.Second
	// DefaultStatusInterval is the least time between two status writes.
	DefaultStatusInterval = 5 * time.Second
	// settle batches bursts of informer events into one resync.
	settle = 50 * time.Millisecond
	// saveInterval is the least time between two writes of the last-known state.
	saveInterval = 2 * time.Second
)

// Config wires a Source.
type Config struct {
	NodeName string
	Rest     *rest.Config
	// StateDir holds the last-known cluster state.
	StateDir string
	Pool     *ipam.Pool
	Log      *zap.Logger
	// ExcludedLabels are pod label keys left out of identities; they must
	// match the controller's (default coordinov1alpha1.DefaultExcludedLabels).
	ExcludedLabels []string
	// NodeAddresses are reported in NodeConfig status; may be nil.
	NodeAddresses  func() []netip.Addr
	PodWait        time.Duration
	SyncWait       time.Duration
	StatusInterval time.Duration

	// WireGuard returns the status.wireGuard to publish given the node's
	// addresses (nil: no encryption); may be nil.
	WireGuard func(addrs []netip.Addr) *coordinov1alpha1.WireGuardStatus
}

// IdentitySink learns the cluster's identities as policy peers;
// *datapath.Datapath is one.
type IdentitySink interface {
	UpsertIdentity(identity.Identity) error
	DeleteIdentity(identity.ID) error
}

// Refresher re-attaches stored endpoints that update reports changed
// (*endpoint.Manager.RefreshEndpoints).
type Refresher func(update func(ep *store.Endpoint) bool) error

// Source is the Kubernetes control-plane source: a controlplane.Source of
// policy snapshots that also feeds the IPAM pool with the node's blocks,
// the identity assigner with cluster identities, ADD with pod labels, and
// the API with the node's status.
type Source struct {
	cfg   Config
	log   *zap.Logger
	kube  kubernetes.Interface
	crd   versioned.Interface
	ids   *Identities
	known *lastKnown // last-known state; replaced from the informers once live

	coreInf informers.SharedInformerFactory
	podInf  informers.SharedInformerFactory
	crdInf  coordinoinformers.SharedInformerFactory
	ncInf   coordinoinformers.SharedInformerFactory
	pods    corelisters.PodLister
	nss     corelisters.NamespaceLister
	irs     coordinolisters.PolicyIRLister
	ncs     coordinolisters.NodeConfigLister
	idents  coordinolisters.IdentityLister
	nips    coordinolisters.NodeIsolationPolicyLister
	hasSync []cache.InformerSynced

	// remote turns other nodes' NodeEndpoints into ipcache deltas;
	// nodeEps also holds this node's own object (publish.go).
	remote      *remoteEndpoints
	nodeEps     coordinolisters.NodeEndpointsLister
	remoteCount atomic.Int64
	// remoteSynced: the sink was told its remote view is complete (apply
	// loop only).
	remoteSynced bool
	publishKick  chan struct{}

	// live: informers synced, the listers are the truth. Atomic, as the
	// datapath asks (through the assigner) while it holds its own lock.
	live atomic.Bool
	// announced is what the apply loop told the sink; only it touches it.
	announced map[identity.ID]identity.Identity
	// fedPorts are the named ports the apply loop gave the sink, by pod.
	fedPorts map[string][]policy.NamedPort
	applied  atomic.Int64 // NodeConfig generation whose blocks the pool has
	tailSave atomic.Bool  // a save of the last-known state is scheduled

	mu        sync.Mutex
	refresher Refresher

	kick       chan struct{}
	dirtyMu    sync.Mutex
	dirty      dirtyBits
	synced     chan struct{}
	syncedOnce sync.Once

	unseenPods   prometheus.Counter
	liveGauge    prometheus.GaugeFunc
	tempGauge    prometheus.GaugeFunc
	statusWrites prometheus.Counter

	endpointWrites prometheus.Counter
	remoteGauge    prometheus.GaugeFunc
}

// dirtyBits say what changed since the last apply.
type dirtyBits struct {
	blocks, policy, identities, pods, nsLbl, remote bool
}

// New builds the clients and informers and loads the last-known state; Run
// starts them.
func New(cfg Config) (*Source, error) {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.NodeName == "" {
		return nil, errors.New("kubernetes source: node name is empty (set NODE_NAME or --node-name)")
	}
	if cfg.ExcludedLabels == nil {
		cfg.ExcludedLabels = coordinov1alpha1.DefaultExcludedLabels
	}
	for _, d := range []*time.Duration{&cfg.PodWait, &cfg.SyncWait, &cfg.StatusInterval} {
		if *d == 0 {
			switch d {
			case &cfg.PodWait:
				*d = DefaultPodWait
			case &cfg.SyncWait:
				*d = DefaultSyncWait
			default:
				*d = DefaultStatusInterval
			}
		}
	}
	rc := rest.CopyConfig(cfg.Rest)
	rc.UserAgent = "coordino-daemon/" + cfg.NodeName
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	crd, err := versioned.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("coordino.io client: %w", err)
	}
	known, err := loadLastKnown(cfg.StateDir)
	if err != nil {
		// A damaged file only costs the outage fallback: say so, go on.
		cfg.Log.Error("ignoring last-known cluster state", zap.Error(err))
		known = nil
	}
	s := &Source{
		cfg: cfg, log: cfg.Log.Named("k8s"), kube: kube, crd: crd, known: known,
		announced: map[identity.ID]identity.Identity{}, fedPorts: map[string][]policy.NamedPort{},
		kick:   make(chan struct{}, 1),
		synced: make(chan struct{}),
		unseenPods: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordino_k8s_pod_label_misses_total",
			Help: "ADDs refused (try again later) because the pod was not in the daemon's cache within the bounded wait."}),
		statusWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordino_k8s_status_writes_total", Help: "NodeConfig status updates written."}),
	}
	s.ids = NewIdentities(s.namespaceLabels)
	s.remote, s.publishKick = newRemoteEndpoints(cfg.NodeName, s.log), make(chan struct{}, 1)
	s.endpointWrites = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "coordino_k8s_node_endpoints_writes_total", Help: "NodeEndpoints writes (create or update) of this node."})
	s.liveGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "coordino_k8s_live",
		Help: "1 while the daemon's view comes from synced informers, 0 while it serves from the last-known state."},
		func() float64 {
			if s.isLive() {
				return 1
			}
			return 0
		})
	s.remoteGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "coordino_remote_endpoints",
		Help: "Pod addresses on other nodes known with their identity (from NodeEndpoints)."},
		func() float64 { return float64(s.remoteCount.Load()) })
	s.tempGauge = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "coordino_identities_temporary",
		Help: "Node-local temporary identities held by endpoints whose label set has no cluster Identity yet."},
		func() float64 { return float64(s.ids.Temporary()) })

	const resync = 0 // watches, no periodic relist
	s.coreInf = informers.NewSharedInformerFactory(kube, resync)
	s.podInf = informers.NewSharedInformerFactoryWithOptions(kube, resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	}))
	s.crdInf = coordinoinformers.NewSharedInformerFactory(crd, resync)
	s.ncInf = coordinoinformers.NewSharedInformerFactoryWithOptions(crd, resync, coordinoinformers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.NodeName).String()
	}))
	podI := s.podInf.Core().V1().Pods()
	nsI := s.coreInf.Core().V1().Namespaces()
	irI := s.crdInf.Coordino().V1alpha1().PolicyIRs()
	ncI := s.ncInf.Coordino().V1alpha1().NodeConfigs()
	idI := s.crdInf.Coordino().V1alpha1().Identities()
	nipI := s.crdInf.Coordino().V1alpha1().NodeIsolationPolicies()
	s.pods, s.nss, s.irs, s.ncs, s.idents = podI.Lister(), nsI.Lister(), irI.Lister(), ncI.Lister(), idI.Lister()
	s.nips = nipI.Lister()
	for _, reg := range []struct {
		inf  cache.SharedIndexInformer
		mark func(*dirtyBits)
	}{
		{podI.Informer(), func(d *dirtyBits) { d.pods = true }},
		{nsI.Informer(), func(d *dirtyBits) { d.policy, d.nsLbl = true, true }},
		{irI.Informer(), func(d *dirtyBits) { d.policy = true }},
		{ncI.Informer(), func(d *dirtyBits) { d.blocks = true }},
		{idI.Informer(), func(d *dirtyBits) { d.identities = true }},
		{nipI.Informer(), func(d *dirtyBits) { d.policy = true }},
	} {
		mark := reg.mark
		h := func(any) { s.markDirty(mark) }
		handled, err := reg.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: h, DeleteFunc: h, UpdateFunc: func(_, n any) { h(n) },
		})
		if err != nil {
			return nil, err
		}
		s.hasSync = append(s.hasSync, handled.HasSynced)
	}
	if err := s.watchNodeEndpoints(); err != nil {
		return nil, err
	}
	return s, nil
}

// Identities is the identity assigner to give the datapath.
func (s *Source) Identities() *Identities { return s.ids }

// Collectors returns the source's Prometheus collectors.
func (s *Source) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.unseenPods, s.liveGauge, s.tempGauge, s.statusWrites, s.endpointWrites, s.remoteGauge}
}

// Synced is closed once the first snapshot (live or last-known) is applied.
func (s *Source) Synced() <-chan struct{} { return s.synced }

// SetRefresher installs the endpoint manager's re-attach hook; until then
// identity and label changes only wait.
func (s *Source) SetRefresher(r Refresher) {
	s.mu.Lock()
	s.refresher = r
	s.mu.Unlock()
	s.markDirty(func(d *dirtyBits) { d.pods = true })
}

func (s *Source) isLive() bool { return s.live.Load() }

func (s *Source) markDirty(f func(*dirtyBits)) {
	s.dirtyMu.Lock()
	f(&s.dirty)
	s.dirtyMu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

var _ controlplane.Source = (*Source)(nil)

// Run starts the informers, applies the first state — live if the API
// server answers within SyncWait, else the last-known state — and then
// every change, until ctx ends. It also writes the NodeConfig status.
func (s *Source) Run(ctx context.Context, sink controlplane.Sink) error {
	for _, f := range []interface{ Start(<-chan struct{}) }{s.coreInf, s.podInf, s.crdInf, s.ncInf} {
		f.Start(ctx.Done())
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.SyncWait)
	live := cache.WaitForCacheSync(wctx.Done(), s.hasSync...)
	cancel()
	if !live {
		if s.known == nil {
			s.log.Warn("API server not synced and no last-known state: waiting for the API server before serving")
			if !cache.WaitForCacheSync(ctx.Done(), s.hasSync...) {
				return nil
			}
			live = true
		} else {
			s.log.Warn("API server not synced: serving from the last-known cluster state until it is",
				zap.Time("saved", s.known.Saved), zap.Int("blocks", len(s.known.Blocks)), zap.Int("pods", len(s.known.Pods)))
		}
	}
	if live {
		s.goLive()
	}
	s.markDirty(func(d *dirtyBits) {
		*d = dirtyBits{blocks: true, policy: true, identities: true, pods: true, nsLbl: true, remote: true}
	})
	go s.statusLoop(ctx)
	if !live {
		go func() {
			if cache.WaitForCacheSync(ctx.Done(), s.hasSync...) {
				s.log.Info("API server synced: converging from the last-known state")
				s.goLive()
				s.markDirty(func(d *dirtyBits) {
					*d = dirtyBits{blocks: true, policy: true, identities: true, pods: true, nsLbl: true, remote: true}
				})
			}
		}()
	}
	var lastSave time.Time
	for {
		select {
		case <-ctx.Done():
			if s.isLive() {
				s.save()
			}
			return nil
		case <-s.kick:
		}
		time.Sleep(settle)
		s.apply(sink)
		s.syncedOnce.Do(func() { close(s.synced) })
		if s.isLive() && time.Since(lastSave) >= saveInterval {
			s.save()
			lastSave = time.Now()
		} else if s.isLive() && s.tailSave.CompareAndSwap(false, true) {
			// Save the tail of a burst too.
			time.AfterFunc(saveInterval, func() { s.tailSave.Store(false); s.markDirty(func(*dirtyBits) {}) })
		}
	}
}

func (s *Source) goLive() { s.live.Store(true) }

// apply brings the pool, the assigner, the sink and the endpoints in line
// with what changed since the last call.
func (s *Source) apply(sink controlplane.Sink) {
	s.dirtyMu.Lock()
	d := s.dirty
	s.dirty = dirtyBits{}
	s.dirtyMu.Unlock()

	if d.blocks {
		s.applyBlocks()
	}
	if d.remote && s.isLive() {
		// Before the policy: the first flush after a start has them.
		rs, _ := sink.(RemoteSink)
		s.remote.apply(rs)
		s.remoteCount.Store(int64(s.remote.count()))
		// The first live apply had every NodeEndpoints the informer listed.
		if ss, ok := sink.(RemoteSyncSink); ok && !s.remoteSynced {
			if err := ss.RemoteEndpointsSynced(); err != nil {
				s.log.Error("dropping unconfirmed remote endpoints", zap.Error(err))
			} else {
				s.remoteSynced = true
			}
		}
	}
	if d.identities || d.nsLbl {
		s.applyIdentities(sink)
	}
	if d.pods {
		s.applyNamedPorts(sink)
	}
	if d.policy {
		if err := sink.UpdatePolicy(s.snapshot()); err != nil {
			s.log.Warn("datapath reported policy errors", zap.Error(err))
		}
	}
	if d.identities || d.nsLbl || d.pods {
		s.refresh()
		s.PublishEndpoints() // named ports, or identities moved
	}
}

func (s *Source) applyBlocks() {
	blocks, gen, ok := s.nodeBlocks()
	if !ok {
		s.log.Info("no NodeConfig for this node yet: no blocks to allocate from", zap.String("node", s.cfg.NodeName))
		return
	}
	specs, err := blockSpecs(blocks)
	if err != nil {
		s.log.Error("NodeConfig has invalid blocks (ignored)", zap.Error(err))
	}
	if err := s.cfg.Pool.SetBlocks(specs); err != nil {
		s.log.Error("applying NodeConfig blocks", zap.Error(err))
	}
	s.applied.Store(gen)
	s.log.Info("blocks applied", zap.Int64("generation", gen), zap.Any("blocks", s.cfg.Pool.Usage()))
}

func (s *Source) nodeBlocks() ([]coordinov1alpha1.NodeBlock, int64, bool) {
	if !s.isLive() {
		if s.known == nil {
			return nil, 0, false
		}
		return s.known.Blocks, s.known.Generation, true
	}
	nc, err := s.ncs.Get(s.cfg.NodeName)
	if err != nil {
		return nil, 0, false
	}
	return nc.Spec.Blocks, nc.Generation, true
}

func (s *Source) applyIdentities(sink controlplane.Sink) {
	want := map[identity.ID]identity.Identity{}
	hashes := map[identity.ID]string{}
	add := func(obj *coordinov1alpha1.Identity) {
		id, hash, err := clusterIdentity(obj)
		if err != nil {
			s.log.Warn("ignoring invalid Identity", zap.Error(err))
			return
		}
		want[id.ID], hashes[id.ID] = id, hash
	}
	if s.isLive() {
		objs, _ := s.idents.List(labels.Everything())
		for _, o := range objs {
			add(o)
		}
	} else if s.known != nil {
		for name, spec := range s.known.Identities {
			add(&coordinov1alpha1.Identity{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec})
		}
	}
	is, _ := sink.(IdentitySink)
	for n, id := range want {
		s.ids.SetCluster(id, hashes[n])
		if old, ok := s.announced[n]; ok && old.Namespace == id.Namespace && maps.Equal(old.Labels, id.Labels) {
			continue
		}
		if is != nil {
			if err := is.UpsertIdentity(id); err != nil {
				s.log.Error("announcing identity to the datapath", zap.Uint32("identity", uint32(n)), zap.Error(err))
				continue
			}
		}
		s.announced[n] = id
	}
	for n := range s.announced {
		if _, ok := want[n]; ok {
			continue
		}
		s.ids.DeleteCluster(n)
		if is != nil {
			if err := is.DeleteIdentity(n); err != nil {
				s.log.Error("withdrawing identity from the datapath", zap.Uint32("identity", uint32(n)), zap.Error(err))
				continue
			}
		}
		delete(s.announced, n)
	}
}

func (s *Source) snapshot() policy.Snapshot {
	var snap policy.Snapshot
	if s.isLive() {
		irs, _ := s.irs.List(labels.Everything())
		nss, _ := s.nss.List(labels.Everything())
		snap.PolicyIRs, snap.Namespaces = irs, nss
		snap.NodeIsolation, _ = s.nips.List(labels.Everything())
	} else if s.known != nil {
		snap.Policies, snap.PolicyIRs = s.known.Policies, s.known.PolicyIRs
		snap.NodeIsolation = s.known.NodeIsolation
		for name, l := range s.known.Namespaces {
			snap.Namespaces = append(snap.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}})
		}
	}
	// Listers return cache order; sort so equal states give equal snapshots.
	slices.SortFunc(snap.Policies, func(a, b *networkingv1.NetworkPolicy) int {
		return cmpStrings(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	slices.SortFunc(snap.PolicyIRs, func(a, b *coordinov1alpha1.PolicyIR) int {
		return cmpStrings(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	slices.SortFunc(snap.Namespaces, func(a, b *corev1.Namespace) int { return cmpStrings(a.Name, b.Name) })
	slices.SortFunc(snap.NodeIsolation, func(a, b *coordinov1alpha1.NodeIsolationPolicy) int { return cmpStrings(a.Name, b.Name) })
	return snap
}

func cmpStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// refresh moves endpoints to their current labels and identities.
func (s *Source) refresh() {
	s.mu.Lock()
	r := s.refresher
	s.mu.Unlock()
	if r == nil {
		return
	}
	err := r(func(ep *store.Endpoint) bool {
		changed := false
		if l, ok := s.podLabelsNow(ep.PodNamespace, ep.PodName, ep.PodUID); ok && !maps.Equal(l, ep.Labels) && !(len(l) == 0 && len(ep.Labels) == 0) {
			s.log.Info("pod labels changed", zap.String("pod", ep.PodNamespace+"/"+ep.PodName))
			ep.Labels = l
			changed = true
		}
		return changed || s.ids.Stale(ep.PodNamespace, ep.Labels)
	})
	if err != nil {
		s.log.Error("refreshing endpoints", zap.Error(err))
	}
}

// Attached implements endpoint.AttachObserver. An ADD may take a temporary
// identity just before the label set's cluster Identity appears; the
// refresh that Identity triggers lists the stored endpoints, and may run
// before this one's record is stored. Such an endpoint is moved now, or it
// would stay on the temporary identity (left out of NodeEndpoints, so
// denied by other nodes' policy) until the next pod or identity event.
func (s *Source) Attached(namespace string, labels map[string]string) {
	if s.ids.Stale(namespace, labels) {
		s.markDirty(func(d *dirtyBits) { d.identities = true })
	}
}

// namespaceLabels returns a namespace's labels from the cache, or from the
// last-known state before the informers have synced.
func (s *Source) namespaceLabels(name string) (map[string]string, bool) {
	if s.isLive() {
		ns, err := s.nss.Get(name)
		if err != nil {
			return nil, false
		}
		return ns.Labels, true
	}
	if s.known == nil {
		return nil, false
	}
	l, ok := s.known.Namespaces[name]
	return l, ok
}

// podLabelsNow returns the security-relevant labels of a pod of this node
// if the daemon knows it (and, given a UID, it is that pod).
func (s *Source) podLabelsNow(namespace, name, uid string) (map[string]string, bool) {
	var l map[string]string
	if s.isLive() {
		p, err := s.pods.Pods(namespace).Get(name)
		if err != nil || (uid != "" && string(p.UID) != uid) {
			return nil, false
		}
		l = p.Labels
	} else {
		if s.known == nil {
			return nil, false
		}
		p, ok := s.known.Pods[namespace+"/"+name]
		if !ok || (uid != "" && p.UID != uid) {
			return nil, false
		}
		l = p.Labels
	}
	return coordinov1alpha1.SecurityLabels(l, nil, s.cfg.ExcludedLabels), true
}

// PodLabels implements endpoint.PodLabeler: the pod's labels from the
// informer cache, waiting at most PodWait for a pod not there yet. It
// never calls the API server.
func (s *Source) PodLabels(ctx context.Context, namespace, name, uid string) (map[string]string, error) {
	deadline := time.Now().Add(s.cfg.PodWait)
	for {
		if l, ok := s.podLabelsNow(namespace, name, uid); ok {
			return l, nil
		}
		if time.Now().After(deadline) {
			s.unseenPods.Inc()
			state := "the API server is synced"
			if !s.isLive() {
				state = "the API server is unreachable and the pod is not in the last-known state"
			}
			return nil, fmt.Errorf("pod not in this node's cache after %v (%s); its labels decide its policy, so it is not attached without them", s.cfg.PodWait, state)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// save writes the informers' view as the last-known state.
func (s *Source) save() {
	lk := &lastKnown{Saved: time.Now().UTC(), Pods: map[string]knownPod{}, Namespaces: map[string]map[string]string{},
		Identities: map[string]coordinov1alpha1.IdentitySpec{}}
	if nc, err := s.ncs.Get(s.cfg.NodeName); err == nil {
		lk.Blocks, lk.Generation = nc.Spec.Blocks, nc.Generation
	} else if s.known != nil {
		lk.Blocks, lk.Generation = s.known.Blocks, s.known.Generation
	}
	pods, _ := s.pods.List(labels.Everything())
	for _, p := range pods {
		lk.Pods[p.Namespace+"/"+p.Name] = knownPod{UID: string(p.UID), Labels: p.Labels, NamedPorts: podNamedPorts(p)}
	}
	nss, _ := s.nss.List(labels.Everything())
	for _, ns := range nss {
		lk.Namespaces[ns.Name] = ns.Labels
	}
	lk.PolicyIRs, _ = s.irs.List(labels.Everything())
	lk.NodeIsolation, _ = s.nips.List(labels.Everything())
	ids, _ := s.idents.List(labels.Everything())
	for _, id := range ids {
		lk.Identities[id.Name] = id.Spec
	}
	if err := lk.save(s.cfg.StateDir); err != nil {
		s.log.Error("saving the last-known cluster state", zap.Error(err))
	}
}

// statusLoop reports block usage and node addresses in NodeConfig status,
// at most once per StatusInterval and only when something changed, except
// when an allocation leaves a family low on addresses (Pool.LowWater): then
// it writes within promptDelay, so the controller tops the node up before it
// fills. It runs off the pod path: an ADD never waits for it.
func (s *Source) statusLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.StatusInterval)
	defer t.Stop()
	var last *coordinov1alpha1.NodeConfigStatus
	var pace statusPacer
	prompt := time.NewTimer(0)
	<-prompt.C
	defer prompt.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.cfg.Pool.LowWater():
			if d, arm := pace.kick(time.Now()); arm {
				prompt.Reset(d)
			}
			continue
		case <-prompt.C:
			pace.fired()
		case <-t.C:
		}
		if !s.isLive() {
			continue
		}
		pace.wrote(time.Now())
		s.writeStatus(ctx, &last)
	}
}

const (
	// promptDelay gathers the allocations of a burst into one write.
	promptDelay = 500 * time.Millisecond
	// promptSpacing bounds prompt writes to one a second per node.
	promptSpacing = time.Second
)

// statusPacer schedules the prompt status writes low-water kicks ask for:
// one per burst (kicks while one is pending coalesce), no sooner than
// promptDelay after the kick nor promptSpacing after the last write.
type statusPacer struct {
	pending   bool
	lastWrite time.Time
}

// kick notes a low-water kick at now; arm says whether to start the timer,
// for d.
func (p *statusPacer) kick(now time.Time) (d time.Duration, arm bool) {
	if p.pending {
		return 0, false
	}
	p.pending = true
	return max(promptDelay, p.lastWrite.Add(promptSpacing).Sub(now)), true
}

func (p *statusPacer) fired() { p.pending = false }

// wrote notes a status write (or its attempt) at now.
func (p *statusPacer) wrote(now time.Time) { p.lastWrite = now }

// writeStatus writes the status the daemon reports now, if it changed since
// *last or the API's copy differs.
func (s *Source) writeStatus(ctx context.Context, last **coordinov1alpha1.NodeConfigStatus) {
	nc, err := s.ncs.Get(s.cfg.NodeName)
	if err != nil {
		return
	}
	want := s.status(nc)
	if *last != nil && statusEqual(**last, want) && statusEqual(nc.Status, want) {
		return
	}
	if statusEqual(nc.Status, want) {
		*last = &want
		return
	}
	upd := nc.DeepCopy()
	upd.Status = want
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = s.crd.CoordinoV1alpha1().NodeConfigs().UpdateStatus(wctx, upd, metav1.UpdateOptions{})
	cancel()
	if err != nil {
		if !apierrors.IsConflict(err) {
			s.log.Warn("writing NodeConfig status (retried later)", zap.Error(err))
		}
		return
	}
	s.statusWrites.Inc()
	*last = &want
}

// status is the NodeConfig status the daemon reports now: usage of every
// block in spec, the node's addresses, and the generation applied.
func (s *Source) status(nc *coordinov1alpha1.NodeConfig) coordinov1alpha1.NodeConfigStatus {
	st := *nc.Status.DeepCopy()
	st.Blocks = nil
	usage := map[netip.Prefix]ipam.Usage{}
	for _, u := range s.cfg.Pool.Usage() {
		usage[u.Prefix] = u
	}
	for _, b := range nc.Spec.Blocks {
		p, err := netip.ParsePrefix(b.CIDR)
		if err != nil {
			continue
		}
		u, ok := usage[p]
		if !ok {
			continue // not applied (invalid, or overlapping one still draining)
		}
		st.Blocks = append(st.Blocks, coordinov1alpha1.BlockUsage{CIDR: b.CIDR, Used: int32(u.Used), Capacity: int32(u.Size)})
	}
	if s.cfg.NodeAddresses != nil {
		addrs := s.cfg.NodeAddresses()
		if len(addrs) > 16 {
			addrs = addrs[:16]
		}
		st.Addresses = nil
		for _, a := range addrs {
			st.Addresses = append(st.Addresses, a.String())
		}
		if s.cfg.WireGuard != nil {
			st.WireGuard = s.cfg.WireGuard(addrs)
		}
	}
	st.ObservedGeneration = s.applied.Load()
	return st
}

func statusEqual(a, b coordinov1alpha1.NodeConfigStatus) bool {
	return slices.Equal(a.Blocks, b.Blocks) && slices.Equal(a.Addresses, b.Addresses) && a.ObservedGeneration == b.ObservedGeneration &&
		equality.Semantic.DeepEqual(a.WireGuard, b.WireGuard)
}
