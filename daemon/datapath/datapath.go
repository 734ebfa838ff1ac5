package datapath

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/datapath/dpapi"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/internal/schema"
	"go.uber.org/zap"
)

// DefaultNamespace is the namespace of endpoints that name none.
const DefaultNamespace = "default"

// ErrPolicyNotSynced is returned by AttachEndpoint before the first
// UpdatePolicy: attaching earlier could leave a new pod briefly unprotected.
var ErrPolicyNotSynced = errors.New("datapath: policy not synced yet: call UpdatePolicy before attaching endpoints")

// LoadError says the eBPF datapath cannot run on this node: the kernel
// refused its BPF objects (a verifier refusal, a missing program or map
// type, no BTF, the memory lock) or there is no BPF filesystem. Unlike a
// configuration or state error, another datapath can run where this one
// cannot (--datapath=auto falls back to nftables on it).
type LoadError struct{ Err error }

func (e *LoadError) Error() string { return e.Err.Error() }
func (e *LoadError) Unwrap() error { return e.Err }

// Config configures Open.
type Config struct {
	// BPFDir is where maps and links are pinned, e.g. /sys/fs/bpf/coordino.
	BPFDir string
	// AttachMode chooses how programs attach to new endpoints; existing
	// endpoints keep the mode they were attached with.
	AttachMode AttachMode
	// Logger receives datapath logs; nil discards them.
	Logger *zap.Logger
	// NodeIPs are this node's addresses: traffic from them is the host identity.
	NodeIPs []netip.Addr
	// Identities assigns endpoint identities; nil numbers label sets on
	// this node (standalone). See identity.Assigner for Kubernetes mode.
	Identities identity.Assigner
	// ConntrackSize is the conntrack table's capacity; 0 means
	// DefaultConntrackSize. Changing it replaces the pinned table.
	ConntrackSize int
	// MapSizes are the other maps' capacities (capacity.go); zero fields
	// take the defaults.
	MapSizes MapSizes
	// ServiceCIDRs are the cluster's Service address ranges: new flows of
	// egress-isolated pods to them are decided after kube-proxy's DNAT.
	ServiceCIDRs []netip.Prefix
	// NoServiceHook leaves the post-DNAT hook detached, as on kernels
	// without BPF netfilter links: such flows are dropped (fail closed).
	NoServiceHook bool
	// Features is the kernel's feature table (daemon/kernel); nil probes
	// the kernel in Open. Each optional path reads it.
	Features *kernel.Features

	// Tests only: a faster retry after a failed map update.
	retryDelay time.Duration
	// Tests only: the least time between background conntrack purges.
	purgeInterval time.Duration
	// Tests only: capacities of maps without a size flag, by name.
	testCapacities map[string]uint32
}

// Endpoint is a pod interface to enforce policy on. The type is shared with
// the endpoint manager (and any other datapath) through dpapi.
type Endpoint = dpapi.Endpoint

// Datapath is the loaded BPF datapath. Its methods are safe for concurrent
// use. It is a front: it holds the lock, the policy engine and the inputs
// the engine does not know (node addresses, remote pods), and each part
// below owns its own maps and state; a part reaches another only through
// its methods. doc.go lists which part owns what.
type Datapath struct {
	cfg     Config
	log     *zap.Logger
	objs    bpf.CoordinoObjects
	state   *ebpf.Map // endpoint records (state.go), the endpoint table's
	metrics *metrics

	// Parts that take no lock of the datapath.
	att *attacher  // endpoint and device hooks, ifindex→key for flows
	ct  *conntrack // conntrack counts, walks, purges of removed endpoints

	// snapMu serialises UpdatePolicy; snap is the last applied snapshot.
	snapMu sync.Mutex
	snap   policy.SnapshotState

	// mu guards what follows, and the parts called under it.
	mu     sync.Mutex
	ids    identity.Assigner
	cidrs  *identity.CIDRs
	engine *policy.Engine
	synced bool
	// cidrsRetained: the CIDR numbers restored at start were trimmed to
	// those the policies use.
	cidrsRetained bool
	// remote are other nodes' pods (remote.go); remoteNodeIPs other nodes'
	// addresses: the remote-node identity.
	remote        remoteAddrs
	remoteNodeIPs []netip.Addr

	// loadTook is how long loading the maps and programs took at Open;
	// tiers says the programs decide the ClusterNetworkPolicy tiers;
	// without, cluster policies are left out of the maps.
	tiers bool
	// programsReused says the programs were a previous start's.
	loadTook       time.Duration
	programsReused bool

	eps    *endpoints     // the endpoint table (endpoints.go)
	mw     *mapWriter     // policy, ipcache, endpoints, config maps (sync.go)
	health *mapHealth     // refused writes of every map (capacity.go)
	retry  *retrier       // backoff of failed writes (retry.go)
	iso    *nodeIsolation // node isolation (nodeiso.go)
	hr     *hostRouting   // host routing and the eBPF tunnel (hostroute.go)
	svc    *services      // the post-DNAT stage (service.go)
}

// Open loads the BPF objects and creates, or adopts, the pinned maps, the
// endpoint records and their links; adopted links switch to the programs
// just loaded without detaching. Policy already in the maps stays enforced
// until the first UpdatePolicy replaces it.
func Open(cfg Config) (_ *Datapath, err error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if err := checkBPFFS(cfg.BPFDir); err != nil {
		return nil, &LoadError{err}
	}
	// Before any pin is touched: pins too new to read stay as they are.
	pinSchema, err := checkPinSchema(cfg.BPFDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.BPFDir, "links"), 0o700); err != nil {
		return nil, fmt.Errorf("datapath: create links dir: %w", err)
	}
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, &LoadError{fmt.Errorf("datapath: raise memlock limit: %w", err)}
	}
	if cfg.Features == nil {
		cfg.Features = kernel.Probe()
	}
	// The tiers need the verifier of 6.6 (6.1 refuses a program with any
	// subprogram at its million instructions: its precision tracking stops
	// at calls); tcx came with 6.6, so it tells those kernels apart without
	// a load that spends the verifier's whole budget to fail. Without, the
	// objects built with no tiered code at all.
	tiers := cfg.Features.Has(kernel.TCX)
	load := bpf.LoadCoordino
	if !tiers {
		load = bpf.LoadCoordinoNotiers
	}
	spec, err := load()
	if err != nil {
		return nil, &LoadError{fmt.Errorf("datapath: load BPF spec: %w", err)}
	}
	if err := errors.Join(spec.Variables["cdo_have_ct_lookup"].Set(cfg.Features.Has(kernel.CTLookup)),
		spec.Variables["cdo_have_tiers"].Set(tiers)); err != nil {
		return nil, fmt.Errorf("datapath: configure BPF programs: %w", err)
	}
	if cfg.Identities == nil {
		cfg.Identities = identity.NewAllocator()
	}
	d := &Datapath{
		cfg:   cfg,
		log:   cfg.Logger.Named("datapath"),
		ids:   cfg.Identities,
		cidrs: identity.NewCIDRs(),
		tiers: tiers,
	}
	d.health = newMapHealth(d.log)
	// A retry flushes again and re-applies node isolation if that failed.
	d.retry = newRetrier(&d.mu, cfg.retryDelay, d.log, func() error {
		err := d.flush("")
		if d.iso.pending() {
			// Its error also names invalid policies, which no retry mends.
			if nerr := d.iso.apply(); d.iso.pending() {
				err = errors.Join(err, nerr)
			}
		}
		return err
	}, func() bool { return d.mw.settled() && !d.iso.pending() })
	d.engine = policy.NewEngine(d.cidrs)
	if err := prepareConntrack(&cfg, spec, d.log); err != nil {
		return nil, err
	}
	resized, err := sizeMaps(&cfg, spec, d.log)
	if err != nil {
		return nil, err
	}
	d.cfg = cfg
	loadStart := time.Now()
	d.programsReused, err = loadObjects(spec, cfg.BPFDir, &d.objs)
	d.loadTook = time.Since(loadStart) // unless reused, the verifier's time: most of a restart
	if err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("datapath: pinned maps in %s do not match this version: %w", cfg.BPFDir, err)
		}
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, &LoadError{fmt.Errorf("datapath: load BPF programs: %+v", verr)}
		}
		return nil, &LoadError{fmt.Errorf("datapath: load BPF objects: %w", err)}
	}
	// From here on one cleanup undoes a failed Open: Close releases what
	// is set and skips what is not. The pins stay for the next Open.
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if err := restoreResized(&d.objs, resized); err != nil {
		return nil, err
	}
	if d.state, err = openStateMap(cfg.BPFDir); err != nil {
		return nil, err
	}
	if d.att, err = newAttacher(cfg.BPFDir, cfg.AttachMode, cfg.Features.Has(kernel.TCX), d.objs.CdoFromEp, d.objs.CdoToEp, d.log); err != nil {
		return nil, err
	}
	if d.hr, err = newHostRouting(hostRoutingMaps{localEps: d.objs.CdoLocalEps, peerBlocks: d.objs.CdoPeerBlocks,
		tunnelPeers: d.objs.CdoTunnelPeers, tunnel: d.objs.CdoTunnel, fibCache: d.objs.CdoFibCache, stats: d.objs.CdoHostrouteStats},
		cfg.Features, d.health, d.log); err != nil {
		return nil, err
	}
	if d.ct, err = openConntrack(d.objs.CdoConntrack, d.objs.CdoCtStats, cfg.BPFDir, cfg.purgeInterval, d.log); err != nil {
		return nil, err
	}
	d.metrics = newMetrics(d)
	if err := d.restore(); err != nil {
		return nil, err
	}
	live := map[uint32]bool{}
	for r := range d.eps.all() {
		live[uint32(r.HostIfIndex)] = true
	}
	if err := d.ct.purgeAtStart(live); err != nil {
		// An attach reusing a pending interface or address retries it.
		d.log.Warn("conntrack purge at start failed; retrying in the background", zap.Error(err))
		d.ct.wake()
	}
	d.svc = &services{cidrs: cfg.ServiceCIDRs, disabled: cfg.NoServiceHook, tiers: d.tiers, features: cfg.Features,
		links: filepath.Join(cfg.BPFDir, "links"), shared: &d.objs.CoordinoMaps, cidrMap: d.objs.CdoSvcCidrs, nodePortMap: d.objs.CdoSvcNodeports, ct: d.ct, log: d.log}
	setFlags := func(mask, set uint32) error {
		d.mu.Lock()
		defer d.mu.Unlock()
		_, err := d.mw.setCfgFlags(mask, set)
		return err
	}
	if err := d.svc.setup(setFlags); err != nil {
		return nil, err
	}
	// Older pins now have this layout (retired pins gone, maps adopted);
	// newer readable ones keep their stamp.
	if pinSchema != schema.ReadNewer {
		if err := writePinSchema(cfg.BPFDir); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// restore rebuilds in-memory state from the pins and re-points adopted
// attachments at the freshly loaded programs.
func (d *Datapath) restore() error {
	var err error
	d.mw, err = openMapWriter(writerMaps{policy: d.objs.CdoPolicy, ipcache: d.objs.CdoIpcache,
		endpoints: d.objs.CdoEndpoints, config: d.objs.CdoConfig}, d.health, d.retry, d.log)
	if err != nil {
		return err
	}
	d.iso = &nodeIsolation{m: d.objs.CdoNodeiso, cfg: d.objs.CdoNodeisoCfg, health: d.health, retry: d.retry,
		log: d.log, bump: d.mw.bumpRevision}
	var cidrErr error
	d.mw.eachIpcache(func(p netip.Prefix, v bpf.CoordinoIpcacheValue) {
		for _, id := range []identity.ID{identity.ID(v.Identity), identity.ID(v.CidrIdentity)} {
			if id.IsCIDR() && id == identity.ID(v.Identity) && cidrErr == nil {
				if err := d.cidrs.Restore(p, id); err != nil {
					cidrErr = fmt.Errorf("datapath: adopt ipcache: %w", err)
				}
			}
		}
	})
	if cidrErr != nil {
		return cidrErr
	}
	d.eps = &endpoints{byKey: map[string]*record{}, podPorts: map[string][]policy.NamedPort{}, state: d.state,
		addrs: d.objs.CdoEpAddrs, ids: d.ids, engine: d.engine, health: d.health, log: d.log,
		mw: d.mw, hr: d.hr, att: d.att, ct: d.ct, flush: func() error { return d.flush("") }}
	adopted, err := d.eps.adopt()
	if err != nil {
		return err
	}
	// Remote pods a previous run left in the ipcache: single addresses of
	// a cluster identity that belong to no local endpoint, known but
	// unconfirmed.
	local := d.eps.localAddrs()
	d.mw.eachIpcache(func(p netip.Prefix, v bpf.CoordinoIpcacheValue) {
		id, a := identity.ID(v.Identity), p.Addr()
		if p.IsSingleIP() && !local[a] && id >= identity.FirstPod && id <= identity.LastCluster {
			d.remote.adopt(a, id)
		}
	})
	d.log.Info("datapath opened", zap.String("bpfDir", d.cfg.BPFDir), zap.Int("adoptedEndpoints", adopted),
		zap.Int("restoredRemoteEndpoints", d.remote.unconfirmedCount()),
		zap.Int("policyEntries", d.mw.usage()[2].Entries), zap.Uint32("policyRevision", d.mw.policyRevision()),
		zap.Duration("programLoad", d.loadTook), zap.Bool("programsReused", d.programsReused))
	return nil
}

// Close releases file descriptors. Pins stay, so attached programs keep
// enforcing policy until the next Open adopts them.
func (d *Datapath) Close() error {
	d.mu.Lock()
	d.retry.stop()
	d.mu.Unlock()
	var errs []error
	if d.ct != nil {
		// After the walk under way: it reads maps closed below.
		errs = append(errs, d.ct.close())
	}
	if d.state != nil {
		errs = append(errs, d.state.Close())
	}
	errs = append(errs, d.objs.Close())
	if d.att != nil {
		d.att.close()
	}
	return errors.Join(errs...)
}

// SetNodeIPs replaces the node's addresses (the host identity), e.g. when a
// bridge or uplink address appears after start.
func (d *Datapath) SetNodeIPs(ips []netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ip := range slices.Concat(d.cfg.NodeIPs, ips) {
		d.mw.markAddr(ip)
	}
	d.cfg.NodeIPs = slices.Clone(ips)
	return d.flush("update node addresses")
}

// AttachEndpoint resolves ep's identity, writes its map entries and policy,
// then attaches and pins its programs; when it returns the endpoint is
// enforced from its first packet. Repeating it for the same key is harmless.
// Callers serialise calls for one key (the endpoint manager's per-attachment
// lock does); calls for different keys run concurrently, and the slow kernel
// attach runs outside the datapath's lock so their waits overlap.
func (d *Datapath) AttachEndpoint(ep Endpoint) error {
	r, err := newRecord(ep)
	if err != nil {
		return err
	}
	if err := checkInterface(ep); err != nil {
		return err
	}
	// Before anything is written: the programs attached below must find no
	// flow of a removed endpoint that had this interface or an address.
	if err := d.ct.settle(uint32(r.HostIfIndex), r.IPs); err != nil {
		return fmt.Errorf("endpoint %q: %w", r.Key, err)
	}
	if err := d.prepareAttach(r); err != nil {
		return err
	}
	recordedMode := r.Mode
	attachErr := d.att.attach(r)
	d.mu.Lock()
	defer d.mu.Unlock()
	if attachErr != nil {
		_ = d.att.detach(r)
		d.eps.forget(r)
		return attachErr
	}
	if err := d.eps.attached(r, recordedMode); err != nil {
		return err
	}
	d.log.Debug("endpoint attached", zap.String("endpoint", r.Key), zap.String("interface", r.HostIfName),
		zap.Uint32("identity", uint32(r.Identity)), zap.String("mode", r.Mode))
	return nil
}

// prepareAttach records r and writes its map entries, so the programs
// attached next enforce policy on the first packet.
func (d *Datapath) prepareAttach(r *record) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.synced {
		return ErrPolicyNotSynced
	}
	return d.eps.prepare(r)
}

// DetachEndpoint removes ep's programs, map entries and state. Unknown
// endpoints and already removed interfaces are not errors. Like
// AttachEndpoint, callers serialise calls for one key.
func (d *Datapath) DetachEndpoint(ep Endpoint) error {
	if ep.Key == "" {
		return errors.New("datapath: detach: endpoint key is empty")
	}
	d.mu.Lock()
	r := d.eps.get(ep.Key)
	d.mu.Unlock()
	if r == nil {
		// Nothing recorded; clear any pins a crash may have left.
		return d.att.unpinLinks(ep.Key)
	}
	// First: host routing would otherwise deliver past the programs removed next.
	d.mu.Lock()
	err := d.hr.deleteLocalEp(r)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	// Outside the lock: releasing a live tcx link waits for RCU.
	if err := d.att.detach(r); err != nil {
		return err
	}
	// The tracked flows are purged by a background walk (ctpurge.go); they
	// are recorded as pending before the record goes, so a crash in
	// between leaves one or the other for the next Open.
	queueErr := d.ct.queue(uint32(r.HostIfIndex), r.IPs)
	d.mu.Lock()
	err = d.eps.remove(r, d.synced)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if queueErr != nil {
		// Not recorded (pending map full): purge now, as nothing else will.
		d.log.Warn("conntrack purge not queued; purging now", zap.Error(queueErr))
		d.ct.purgeEndpoint(uint32(r.HostIfIndex), r.IPs)
	}
	d.log.Debug("endpoint detached", zap.String("endpoint", r.Key))
	return nil
}

// flush has the map writer bring the maps in line with what the engine
// and the other parts want; callers hold mu. Before the first policy
// snapshot it writes nothing: changes are only recorded, and that
// snapshot's flush writes everything. what names the change in the error
// ("" returns it as it is).
func (d *Datapath) flush(what string) error {
	if !d.synced {
		return nil
	}
	err := d.mw.flush(desired{engine: d.engine, eps: d.eps, nodeIPs: d.cfg.NodeIPs,
		remoteNodeIPs: d.remoteNodeIPs, remote: &d.remote})
	if err != nil && what != "" {
		return fmt.Errorf("datapath: %s: %w", what, err)
	}
	return err
}

// Endpoints returns the keys of all attached endpoints, including those
// adopted from pinned state.
func (d *Datapath) Endpoints() ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var keys []string
	for _, r := range d.eps.sorted() {
		keys = append(keys, r.Key)
	}
	return keys, nil
}

func newRecord(ep Endpoint) (*record, error) {
	if _, err := stateKey(ep.Key); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	if ep.HostIfIndex <= 0 {
		return nil, fmt.Errorf("endpoint %q: invalid host ifindex %d", ep.Key, ep.HostIfIndex)
	}
	r := &record{
		Key: ep.Key, HostIfName: ep.HostIfName, HostIfIndex: ep.HostIfIndex,
		Namespace: ep.Namespace, Labels: maps.Clone(ep.Labels), Pod: ep.Pod,
	}
	if ep.HostMAC != nil && ep.PodMAC != nil {
		r.HostMAC, r.PodMAC = ep.HostMAC.String(), ep.PodMAC.String()
	}
	if r.Namespace == "" {
		r.Namespace = DefaultNamespace
	}
	for _, ip := range ep.IPs {
		if !ip.IsValid() {
			return nil, fmt.Errorf("endpoint %q: invalid IP address", ep.Key)
		}
		r.IPs = append(r.IPs, ip.Unmap())
	}
	return r, nil
}

// checkInterface guards against a stale ifindex naming another interface.
func checkInterface(ep Endpoint) error {
	name, err := interfaceName(ep.HostIfIndex)
	if err != nil {
		return fmt.Errorf("endpoint %q: host interface %d: %w", ep.Key, ep.HostIfIndex, err)
	}
	if ep.HostIfName != "" && name != ep.HostIfName {
		return fmt.Errorf("endpoint %q: ifindex %d is %q, not %q", ep.Key, ep.HostIfIndex, name, ep.HostIfName)
	}
	return nil
}
