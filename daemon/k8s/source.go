package k8s

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/controlplane"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/daemon/store"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
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
	// ExcludedLabels are pod label keys left out of identities unless a
	// policy selects on them; they must match the controller's (default
	// coordinov1alpha1.DefaultExcludedLabels).
	ExcludedLabels []string
	// NodeAddresses are reported in NodeConfig status; may be nil.
	NodeAddresses  func() []netip.Addr
	PodWait        time.Duration
	SyncWait       time.Duration
	StatusInterval time.Duration

	// WireGuard returns the status.wireGuard to publish given the node's
	// addresses (nil: no encryption); may be nil.
	WireGuard func(addrs []netip.Addr) *coordinov1alpha1.WireGuardStatus
	// BGP returns the status.bgp to publish (nil without --routing=bgp).
	BGP func() []coordinov1alpha1.BGPSessionStatus
}

// Refresher re-attaches stored endpoints that update reports changed
// (*endpoint.Manager.RefreshEndpoints).
type Refresher func(update func(ep *store.Endpoint) bool) error

// Source is the Kubernetes control-plane source: it feeds a Sink with
// policy snapshots, identities, named ports and remote endpoints, the IPAM
// pool with the node's blocks, the identity assigner with cluster
// identities, ADD with pod labels, and the API with the node's status and
// endpoints. It reads the cluster through one view: the last-known state
// until the informers sync, their listers after.
type Source struct {
	cfg  Config
	log  *zap.Logger
	kube kubernetes.Interface
	crd  versioned.Interface
	ids  *Identities
	inf  *informerSet
	cur  atomic.Pointer[view]
	m    sourceMetrics
	// excluded is ExcludedLabels without the keys some policy selects on
	// (policyir.SelectedLabels), as the controller derives them.
	excluded atomic.Pointer[[]string]

	// remote turns other nodes' NodeEndpoints into ipcache deltas.
	remote      *remoteEndpoints
	remoteCount atomic.Int64
	// remoteSynced: the sink was told its remote view is complete (apply
	// loop only).
	remoteSynced bool
	publishKick  chan struct{}

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
	// started and stopped frame Run, so the daemon can wait for its last
	// save before the process exits (Wait).
	started  atomic.Bool
	stopped  chan struct{}
	stopOnce sync.Once
}

// dirtyBits say what changed since the last apply.
type dirtyBits struct {
	blocks, policy, identities, pods, nsLbl, remote bool
}

// everything is every bit set: a new view changes all of it.
var everything = dirtyBits{blocks: true, policy: true, identities: true, pods: true, nsLbl: true, remote: true}

// New builds the clients and informers and loads the last-known state; Run
// starts them.
func New(cfg Config) (*Source, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
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
	cnp, err := cnpclient.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("policy.networking.k8s.io client: %w", err)
	}
	known, err := loadLastKnown(cfg.StateDir)
	if err != nil {
		// A damaged file only costs the outage fallback: say so, go on.
		cfg.Log.Error("ignoring last-known cluster state", zap.Error(err))
		known = nil
	}
	s := &Source{
		cfg: cfg, log: cfg.Log.Named("k8s"), kube: kube, crd: crd,
		announced: map[identity.ID]identity.Identity{}, fedPorts: map[string][]policy.NamedPort{},
		kick: make(chan struct{}, 1), synced: make(chan struct{}), publishKick: make(chan struct{}, 1), stopped: make(chan struct{}),
	}
	s.setView(known)
	s.excluded.Store(&cfg.ExcludedLabels)
	s.ids = NewIdentities(func(name string) (map[string]string, bool) { return s.view().namespaceLabels(name) })
	s.remote = newRemoteEndpoints(cfg.NodeName, s.log)
	s.m = newSourceMetrics(s)
	s.inf, err = newInformers(kube, crd, cnp, cfg.NodeName, s.markDirty,
		s.remote.handler(func() { s.markDirty(func(d *dirtyBits) { d.remote = true }) }))
	if err != nil {
		return nil, err
	}
	s.inf.live.known = known
	return s, nil
}

// withDefaults checks cfg and fills in what is left unset.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.NodeName == "" {
		return cfg, errors.New("kubernetes source: node name is empty (set NODE_NAME or --node-name)")
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.ExcludedLabels == nil {
		cfg.ExcludedLabels = coordinov1alpha1.DefaultExcludedLabels
	}
	if cfg.PodWait == 0 {
		cfg.PodWait = DefaultPodWait
	}
	if cfg.SyncWait == 0 {
		cfg.SyncWait = DefaultSyncWait
	}
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = DefaultStatusInterval
	}
	return cfg, nil
}

// view is what the source reads the cluster through now.
func (s *Source) view() view { return *s.cur.Load() }

// setView makes v the view; it is atomic, as the datapath asks (through the
// assigner) while it holds its own lock.
func (s *Source) setView(v view) { s.cur.Store(&v) }

// Identities is the identity assigner to give the datapath.
func (s *Source) Identities() *Identities { return s.ids }

// Collectors returns the source's Prometheus collectors.
func (s *Source) Collectors() []prometheus.Collector { return s.m.collectors() }

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

func (s *Source) markDirty(f func(*dirtyBits)) {
	s.dirtyMu.Lock()
	f(&s.dirty)
	s.dirtyMu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

var _ controlplane.Source[Sink] = (*Source)(nil)

// Run starts the informers, applies the first state — live if the API
// server answers within SyncWait, else the last-known state — and then
// every change, until ctx ends. It also writes the NodeConfig status.
func (s *Source) Run(ctx context.Context, sink Sink) error {
	s.started.Store(true)
	defer s.stopOnce.Do(func() { close(s.stopped) })
	if !s.startInformers(ctx) {
		return nil
	}
	go s.statusLoop(ctx)
	var lastSave time.Time
	for {
		select {
		case <-ctx.Done():
			s.save()
			return nil
		case <-s.kick:
		}
		time.Sleep(settle)
		s.apply(sink)
		s.syncedOnce.Do(func() { close(s.synced) })
		if time.Since(lastSave) >= saveInterval {
			if s.save() {
				lastSave = time.Now()
			}
		} else if s.tailSave.CompareAndSwap(false, true) {
			// Save the tail of a burst too.
			time.AfterFunc(saveInterval, func() { s.tailSave.Store(false); s.markDirty(func(*dirtyBits) {}) })
		}
	}
}

// startInformers starts the informers and waits up to SyncWait for them:
// synced, the source goes live at once; if not, it serves from the
// last-known state and goes live when they are; with no last-known state
// it waits for them (false: ctx ended first).
func (s *Source) startInformers(ctx context.Context) bool {
	s.inf.start(ctx.Done())
	wctx, cancel := context.WithTimeout(ctx, s.cfg.SyncWait)
	synced := cache.WaitForCacheSync(wctx.Done(), s.inf.hasSync...)
	cancel()
	known := s.inf.live.known
	switch {
	case synced:
		s.goLive()
	case known == nil:
		s.log.Warn("API server not synced and no last-known state: waiting for the API server before serving")
		if !cache.WaitForCacheSync(ctx.Done(), s.inf.hasSync...) {
			return false
		}
		s.goLive()
	default:
		s.log.Warn("API server not synced: serving from the last-known cluster state until it is",
			zap.Time("saved", known.Saved), zap.Int("blocks", len(known.Blocks)), zap.Int("pods", len(known.Pods)))
		s.markDirty(func(d *dirtyBits) { *d = everything })
		go func() {
			if cache.WaitForCacheSync(ctx.Done(), s.inf.hasSync...) {
				s.log.Info("API server synced: converging from the last-known state")
				s.goLive()
			}
		}()
	}
	return true
}

// goLive swaps the informers' view in and has everything re-applied from it.
func (s *Source) goLive() {
	s.setView(s.inf.live)
	s.markDirty(func(d *dirtyBits) { *d = everything })
}

// apply brings the pool, the assigner, the sink and the endpoints in line
// with what changed since the last call.
func (s *Source) apply(sink Sink) {
	s.dirtyMu.Lock()
	d := s.dirty
	s.dirty = dirtyBits{}
	s.dirtyMu.Unlock()
	v := s.view()

	var snap policy.Snapshot
	if d.policy {
		snap = snapshot(v)
		if s.applyExcluded(snap) {
			d.pods = true // endpoints move to their new label sets
		}
	}
	if d.blocks {
		s.applyBlocks(v)
	}
	if d.remote && v.live() {
		// Before the policy: the first flush after a start has them.
		s.applyRemote(sink)
	}
	if d.identities || d.nsLbl {
		s.applyIdentities(v, sink)
	}
	if d.pods {
		s.applyNamedPorts(v, sink)
	}
	if d.policy {
		if err := sink.UpdatePolicy(snap); err != nil {
			s.log.Warn("datapath reported policy errors", zap.Error(err))
		}
	}
	if d.identities || d.nsLbl || d.pods {
		s.refresh()
		s.PublishEndpoints() // named ports, or identities moved
	}
}

// applyExcluded derives the excluded labels no policy of snap selects on;
// it reports whether they changed.
func (s *Source) applyExcluded(snap policy.Snapshot) bool {
	sel := policyir.NewSelectedLabels(s.cfg.ExcludedLabels)
	for _, ir := range snap.PolicyIRs {
		sel.Set(policyir.PolicyIRKey(ir.Namespace, ir.Name), func(add func(string)) { policyir.PodLabelKeys(&ir.Spec, add) })
	}
	for _, cnp := range snap.ClusterPolicies {
		sel.Set(policyir.ClusterPolicyKey(cnp.Name), func(add func(string)) { policyir.ClusterPodLabelKeys(cnp, add) })
	}
	excluded := sel.Excluded()
	if slices.Equal(excluded, s.excludedNow()) {
		return false
	}
	s.log.Info("pod labels left out of identities changed (policies select on the others)", zap.Strings("excluded", excluded))
	s.excluded.Store(&excluded)
	return true
}

// excludedNow is the pod label keys identities leave out now.
func (s *Source) excludedNow() []string {
	if e := s.excluded.Load(); e != nil {
		return *e
	}
	return s.cfg.ExcludedLabels
}

func (s *Source) applyBlocks(v view) {
	blocks, gen, ok := v.nodeBlocks()
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

// applyRemote gives the sink the remote endpoints that changed; the first
// time, every NodeEndpoints the informer listed is among them, so the sink
// learns its remote view is complete.
func (s *Source) applyRemote(sink Sink) {
	s.remote.apply(sink)
	s.remoteCount.Store(int64(s.remote.count()))
	if s.remoteSynced {
		return
	}
	if err := sink.RemoteEndpointsSynced(); err != nil {
		s.log.Error("dropping unconfirmed remote endpoints", zap.Error(err))
		return
	}
	s.remoteSynced = true
}

func (s *Source) applyIdentities(v view, sink Sink) {
	want := map[identity.ID]identity.Identity{}
	hashes := map[identity.ID]string{}
	for _, obj := range v.identities() {
		id, hash, err := clusterIdentity(obj)
		if err != nil {
			s.log.Warn("ignoring invalid Identity", zap.Error(err))
			continue
		}
		want[id.ID], hashes[id.ID] = id, hash
	}
	for n, id := range want {
		s.ids.SetCluster(id, hashes[n])
		if old, ok := s.announced[n]; ok && old.Namespace == id.Namespace && maps.Equal(old.Labels, id.Labels) {
			continue
		}
		if err := sink.UpsertIdentity(id); err != nil {
			s.log.Error("announcing identity to the datapath", zap.Uint32("identity", uint32(n)), zap.Error(err))
			continue
		}
		s.announced[n] = id
	}
	for n := range s.announced {
		if _, ok := want[n]; ok {
			continue
		}
		s.ids.DeleteCluster(n)
		if err := sink.DeleteIdentity(n); err != nil {
			s.log.Error("withdrawing identity from the datapath", zap.Uint32("identity", uint32(n)), zap.Error(err))
			continue
		}
		delete(s.announced, n)
	}
}

// snapshot is v's policy, sorted: listers return cache order, and equal
// states must give equal snapshots.
func snapshot(v view) policy.Snapshot {
	snap := v.policy()
	slices.SortFunc(snap.Policies, func(a, b *networkingv1.NetworkPolicy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	slices.SortFunc(snap.PolicyIRs, func(a, b *coordinov1alpha1.PolicyIR) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	slices.SortFunc(snap.ClusterPolicies, func(a, b *cnpv1beta1.ClusterNetworkPolicy) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(snap.Namespaces, func(a, b *corev1.Namespace) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(snap.NodeIsolation, func(a, b *coordinov1alpha1.NodeIsolationPolicy) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(snap.Nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	return snap
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

// podLabelsNow returns the security-relevant labels of a pod of this node
// if the daemon knows it (and, given a UID, it is that pod).
func (s *Source) podLabelsNow(namespace, name, uid string) (map[string]string, bool) {
	l, ok := s.view().podLabels(namespace, name, uid)
	if !ok {
		return nil, false
	}
	return coordinov1alpha1.SecurityLabels(l, nil, s.excludedNow()), true
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
			s.m.unseenPods.Inc()
			state := "the API server is synced"
			if !s.view().live() {
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

// Wait returns once Run has returned after its context ended, its last
// save of the last-known state done, or after timeout; at once when Run
// never started. A process that exits in the middle of that save leaves
// the state of the save before and a temporary file beside it.
func (s *Source) Wait(timeout time.Duration) {
	if !s.started.Load() {
		return
	}
	select {
	case <-s.stopped:
	case <-time.After(timeout):
		s.log.Warn("control-plane source still saving its last-known state at exit", zap.Duration("waited", timeout))
	}
}

// save writes the view as the last-known state, if it is newer than what
// is on disk; false when there was nothing to save.
func (s *Source) save() bool {
	lk := s.view().state()
	if lk == nil {
		return false
	}
	if err := lk.save(s.cfg.StateDir); err != nil {
		s.log.Error("saving the last-known cluster state", zap.Error(err))
	}
	return true
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
		nc, ok := s.view().nodeConfig()
		if !ok {
			continue
		}
		pace.wrote(time.Now())
		s.writeStatus(ctx, nc, &last)
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
// *last or nc, the API's copy, differs.
func (s *Source) writeStatus(ctx context.Context, nc *coordinov1alpha1.NodeConfig, last **coordinov1alpha1.NodeConfigStatus) {
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
	_, err := s.crd.CoordinoV1alpha1().NodeConfigs().UpdateStatus(wctx, upd, metav1.UpdateOptions{})
	cancel()
	if err != nil {
		if !apierrors.IsConflict(err) {
			s.log.Warn("writing NodeConfig status (retried later)", zap.Error(err))
		}
		return
	}
	s.m.statusWrites.Inc()
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
	if s.cfg.BGP != nil {
		st.BGP = s.cfg.BGP()
	}
	st.ObservedGeneration = s.applied.Load()
	return st
}

func statusEqual(a, b coordinov1alpha1.NodeConfigStatus) bool {
	return slices.Equal(a.Blocks, b.Blocks) && slices.Equal(a.Addresses, b.Addresses) && a.ObservedGeneration == b.ObservedGeneration &&
		equality.Semantic.DeepEqual(a.WireGuard, b.WireGuard) && equality.Semantic.DeepEqual(a.BGP, b.BGP)
}
