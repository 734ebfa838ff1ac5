package nftdp

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"github.com/prometheus/client_golang/prometheus"
	vnetlink "github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/datapath/dpapi"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/internal/schema"
)

// ErrPolicyNotSynced is returned by AttachEndpoint before the first
// UpdatePolicy: attaching earlier could leave a new pod briefly unprotected.
var ErrPolicyNotSynced = errors.New("nftables datapath: policy not synced yet: call UpdatePolicy before attaching endpoints")

// Config configures Open.
type Config struct {
	// StateDir keeps the endpoint records a restarted daemon adopts.
	StateDir string
	// NodeIPs are this node's addresses: traffic from them is the host
	// identity, always allowed towards pods.
	NodeIPs []netip.Addr
	// Identities assigns endpoint identities; nil numbers label sets on
	// this node (standalone).
	Identities identity.Assigner
	// Logger receives datapath logs; nil discards them.
	Logger *zap.Logger
	// NetNS is a file descriptor of the network namespace to program; 0
	// is the caller's (tests program a namespace of their own).
	NetNS int
}

// Datapath enforces policy with nftables. Its methods are safe for
// concurrent use.
type Datapath struct {
	cfg   Config
	log   *zap.Logger
	conn  *nftables.Conn // reads
	lay   *layout
	store recordStore

	// snapMu serialises UpdatePolicy; snap is the last applied snapshot.
	snapMu sync.Mutex
	snap   policy.SnapshotState

	// mu guards what follows.
	mu     sync.Mutex
	ids    identity.Assigner
	cidrs  *identity.CIDRs
	engine *policy.Engine
	synced bool
	eps    map[string]*record // by key
	// podPorts are the named ports of this node's pods, by "namespace/name".
	podPorts map[string][]policy.NamedPort
	remote   map[netip.Addr]identity.ID
	// unconfirmed are remote addresses adopted from the table at start that
	// no remote source has confirmed yet (RemoteEndpointsSynced drops them).
	unconfirmed map[netip.Addr]struct{}
	nodeIPs     []netip.Addr
	// groups indexes the engine's wanted keys by allow-set group.
	groups map[group]map[policy.Key]struct{}
	// byRemote indexes the groups with keys by remote identity.
	byRemote map[identity.ID]map[group]struct{}
	// tiers indexes the engine's keys with tier rules (tiers_linux.go).
	tiers tierIndex
	// adoptedRemote are the remote pods the adopted table's pods maps name.
	adoptedRemote map[netip.Addr]identity.ID
	inst          installed
	dirty         dirtySet
	stats         stats
	// The table's schema stamp found at Open and what this build does
	// with it (schema_linux.go).
	tableStamp    schema.Stamp
	tableDecision schema.Decision
	// emitAllowed says whether the allowed-flow chains report.
	emitAllowed bool
	flowCounts  flowCounters
	// iso is node isolation's state (nodeiso_linux.go).
	iso nodeIsoState
	// onLocalChange is told when endpoints or their identities change
	// (this node's NodeEndpoints publisher); it must only signal.
	onLocalChange func()
	// Group commit (commit_linux.go): attaches waiting for a transaction,
	// whether one is in the kernel (mu is released meanwhile), whether an
	// attach retrying alone holds the others back, and settled, signalled
	// on mu when a transaction ends or that attach is done.
	waiting    []*attachWait
	committing bool
	exclusive  bool
	settled    *sync.Cond
	// Deferred deletion (sweep_linux.go): the chains and sets no longer
	// referenced, left for the sweep, which its timer runs; sweepFailing
	// says the last sweep was refused (logged once); closed stops it.
	doomed map[object]struct{}
	// dying are the detached endpoints, by key, still in eps (their
	// addresses still theirs) until the sweep finishes their detach.
	dying        map[string]*record
	sweepTimer   *time.Timer
	sweepArmed   bool
	sweepFailing bool
	closed       bool
}

// installed mirrors what the table holds, so a flush writes differences.
type installed struct {
	host map[netip.Addr]struct{}
	// pods are the pods maps' elements: by address, the chain each local
	// identity's map jumps to.
	pods  map[netip.Addr]map[localDir]string
	cidrs map[cidrElem]string
	pairs map[group]pairState
	// locals are the identities whose maps and "any remote" chains exist.
	locals map[identity.ID]bool
	src    map[srcElem]struct{}
	eps    map[string]epState // by host interface
	// units are the tier units, tierAddrs the units whose pods maps hold
	// an address.
	units     map[tierUnit]*unitState
	tierAddrs map[netip.Addr]map[tierUnit]struct{}
}

// pairState is what an identity pair's chain holds: the elements it was
// rendered from, unknown for a chain adopted at start.
type pairState struct {
	elems []allowElem
	known bool
}

// srcElem is one address a pod interface may send from.
type srcElem struct {
	ifname string
	addr   netip.Addr
}

// epState is what an endpoint's chains were rendered from; the zero value
// (an adopted chain) matches no endpoint, so the first flush rewrites it.
type epState struct {
	id  identity.ID
	iso policy.Isolation
	// dead chains start with a drop (a dying endpoint's).
	dead bool
}

// dirtySet is what the next flush compares.
type dirtySet struct {
	all bool
	// addrs whose owner may have changed; remotes whose pairs came or went.
	addrs   map[netip.Addr]struct{}
	remotes map[identity.ID]struct{}
	groups  map[group]struct{}
	cidr    bool
	host    bool
	ifnames map[string]struct{}
	units   map[tierUnit]struct{}
	iso     bool
}

func (s *dirtySet) reset() {
	*s = dirtySet{addrs: map[netip.Addr]struct{}{}, remotes: map[identity.ID]struct{}{},
		groups: map[group]struct{}{}, ifnames: map[string]struct{}{}, units: map[tierUnit]struct{}{}}
}

// merge adds what o holds: the pending items of a refused transaction
// join those marked while it was in the kernel.
func (s *dirtySet) merge(o dirtySet) {
	s.all = s.all || o.all
	s.cidr = s.cidr || o.cidr
	s.host = s.host || o.host
	s.iso = s.iso || o.iso
	maps.Copy(s.addrs, o.addrs)
	maps.Copy(s.remotes, o.remotes)
	maps.Copy(s.groups, o.groups)
	maps.Copy(s.ifnames, o.ifnames)
	maps.Copy(s.units, o.units)
}

// Open creates the table, or adopts the one a previous run left with the
// policy it holds in force, and the endpoint records of that run.
func Open(cfg Config) (_ *Datapath, err error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Identities == nil {
		cfg.Identities = identity.NewAllocator()
	}
	d := &Datapath{
		cfg: cfg, log: cfg.Logger.Named("nftables"), lay: newLayout(),
		store: recordStore{dir: cfg.StateDir},
		ids:   cfg.Identities, cidrs: identity.NewCIDRs(),
		eps: map[string]*record{}, podPorts: map[string][]policy.NamedPort{},
		remote: map[netip.Addr]identity.ID{}, unconfirmed: map[netip.Addr]struct{}{},
		nodeIPs: unmapAll(cfg.NodeIPs), groups: map[group]map[policy.Key]struct{}{},
		byRemote: map[identity.ID]map[group]struct{}{}, adoptedRemote: map[netip.Addr]identity.ID{},
		tiers: newTierIndex(), doomed: map[object]struct{}{}, dying: map[string]*record{},
	}
	if d.conn, err = d.newConn(); err != nil {
		return nil, err
	}
	d.engine = policy.NewEngine(d.cidrs)
	d.settled = sync.NewCond(&d.mu)
	d.dirty.reset()
	found, err := d.adoptTable()
	if err != nil {
		return nil, err
	}
	if !found {
		// Records without a table describe chains a reboot (or someone)
		// took away; the daemon re-attaches its pods from its own store.
		// A record written unsynced before a power loss may be torn.
		if err := d.store.clear(); err != nil {
			return nil, err
		}
	}
	c, err := d.newConn()
	if err != nil {
		return nil, err
	}
	if err := d.lay.ensure(c); err != nil {
		return nil, err
	}
	// The stamp changes with the layout: one transaction migrates.
	d.stamp(c)
	// A table of format 4 or older has no pod-ifs set: the adopted pods'
	// interfaces join it here (an element added twice is no error).
	var podIfs []nftables.SetElement
	for ifname := range d.inst.eps {
		podIfs = append(podIfs, nftables.SetElement{Key: ifnameBytes(ifname)})
	}
	if len(podIfs) > 0 {
		if err := c.SetAddElements(d.lay.sets[setPodIfs], podIfs); err != nil {
			return nil, fmt.Errorf("nftables datapath: set %s: %w", setPodIfs, err)
		}
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables datapath: create table inet %s (needs nf_tables, nft_ct, nft_meta, concatenated interval sets): %w", TableName, err)
	}
	if err := d.adoptRecords(); err != nil {
		return nil, err
	}
	d.log.Info("nftables datapath opened", zap.String("table", "inet "+TableName),
		zap.Int("adoptedEndpoints", len(d.eps)), zap.Int("adoptedPairs", len(d.inst.pairs)))
	return d, nil
}

// newConn opens a netlink connection to the configured namespace's
// nftables; each transaction takes its own.
func (d *Datapath) newConn() (*nftables.Conn, error) {
	opts := []nftables.ConnOption{nftables.WithSockOptions(bigBuffers)}
	if d.cfg.NetNS != 0 {
		opts = append(opts, nftables.WithNetNSFd(d.cfg.NetNS))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("nftables datapath: %w", err)
	}
	return c, nil
}

// socketBuffer bounds one transaction: the kernel takes a batch in one
// message, which must fit the socket's send buffer (the first snapshot of
// 10,000 rules is megabytes), and answers each of its messages, which
// must fit the receive buffer: a lost answer would leave a transaction
// the kernel applied looking refused. Both are raised past the
// net.core.[rw]mem_max sysctls as nft does; memory is only used as
// messages need it.
const socketBuffer = 256 << 20

func bigBuffers(c *netlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		for _, opt := range [][2]int{{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}, {unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}} {
			err := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt[0], socketBuffer)
			if err != nil { // without CAP_NET_ADMIN: as much as the sysctl allows
				err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt[1], socketBuffer)
			}
			serr = errors.Join(serr, err)
		}
	}); err != nil {
		return err
	}
	return serr
}

func unmapAll(ips []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.Unmap())
	}
	return out
}

// adoptTable reads what the table a previous run left holds into the
// mirror; nothing is changed, so that policy stays in force until the
// first snapshot's flush replaces it by difference.
func (d *Datapath) adoptTable() (found bool, err error) {
	d.inst = installed{host: map[netip.Addr]struct{}{}, pods: map[netip.Addr]map[localDir]string{},
		cidrs: map[cidrElem]string{}, pairs: map[group]pairState{}, locals: map[identity.ID]bool{},
		src: map[srcElem]struct{}{}, eps: map[string]epState{},
		units: map[tierUnit]*unitState{}, tierAddrs: map[netip.Addr]map[tierUnit]struct{}{}}
	if _, err := d.conn.ListTableOfFamily(TableName, nftables.TableFamilyINet); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("nftables datapath: look for table inet %s: %w", TableName, err)
	}
	// Before anything else: a table this build cannot read is left as
	// it is, in force.
	if err := d.checkTableSchema(); err != nil {
		return true, err
	}
	chains, err := d.conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return true, fmt.Errorf("nftables datapath: list chains of inet %s: %w", TableName, err)
	}
	// Endpoint chains, by interface: those no eps element reaches were
	// doomed by a run killed before its sweep.
	epChains := map[string][]string{}
	for _, ch := range chains {
		if ch.Table.Name != TableName {
			continue
		}
		if ifname, ok := parseEndpointChain(ch.Name); ok {
			epChains[ifname] = append(epChains[ifname], ch.Name)
		}
		if g, ok := parsePairChain(ch.Name); ok {
			d.inst.pairs[g] = pairState{}
		}
		if u, cl, ok := parseClassChain(ch.Name); ok {
			d.adoptUnit(u).classes[cl] = classState{}
		}
	}
	sets, err := d.conn.GetSets(d.lay.table)
	if err != nil {
		return true, fmt.Errorf("nftables datapath: list sets of inet %s: %w", TableName, err)
	}
	for _, s := range sets {
		local, dir, _, cidr, isLocal := parseLocalSet(s.Name)
		unit, _, tierCIDR, isTier := parseTierSet(s.Name)
		if !isLocal && !isTier && d.lay.sets[s.Name] == nil {
			continue
		}
		elems, err := d.conn.GetSetElements(s)
		if err != nil {
			return true, fmt.Errorf("nftables datapath: read set %s: %w", s.Name, err)
		}
		if isLocal {
			d.inst.locals[local] = true
		}
		if isTier {
			d.adoptUnit(unit)
		}
		for _, e := range elems {
			switch {
			case isTier:
				d.adoptTierElem(unit, tierCIDR, e)
			case isLocal && cidr:
				d.adoptCIDR(localDir{local, dir}, e)
			case isLocal:
				d.adoptPod(localDir{local, dir}, e)
			default:
				d.inst.adopt(s.Name, e)
			}
		}
	}
	for ifname, names := range epChains {
		if _, ok := d.inst.eps[ifname]; !ok {
			for _, name := range names {
				d.doomed[object{name: name}] = struct{}{}
			}
		}
	}
	return true, nil
}

// adoptPod records an element of a pods map, and the remote pod it names.
func (d *Datapath) adoptPod(ld localDir, e nftables.SetElement) {
	a, ok := netip.AddrFromSlice(e.Key)
	chain := verdictChain(e.Val)
	g, isPair := parsePairChain(chain)
	if !ok || !isPair {
		return
	}
	if d.inst.pods[a] == nil {
		d.inst.pods[a] = map[localDir]string{}
	}
	d.inst.pods[a][ld] = chain
	if g.remote >= identity.FirstPod && g.remote <= identity.LastCluster {
		d.adoptedRemote[a] = g.remote
	}
}

// adoptCIDR records an element of a cidrs map.
func (d *Datapath) adoptCIDR(ld localDir, e nftables.SetElement) {
	if r, ok := rangeOf(e); ok {
		if chain := verdictChain(e.Val); chain != "" {
			d.inst.cidrs[cidrElem{ld, r}] = chain
		}
	}
}

// rangeOf reads the address range of an element of a cidrs map.
func rangeOf(e nftables.SetElement) (addrRange, bool) {
	if len(e.Key) < 8 || len(e.KeyEnd) != len(e.Key) {
		return addrRange{}, false
	}
	lo, ok1 := netip.AddrFromSlice(e.Key[:len(e.Key)-4])
	hi, ok2 := netip.AddrFromSlice(e.KeyEnd[:len(e.KeyEnd)-4])
	return addrRange{lo, hi}, ok1 && ok2
}

// verdictChain reads the chain of a verdict map element's data (the
// nested verdict attributes).
func verdictChain(b []byte) string {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return ""
	}
	for ad.Next() {
		if ad.Type() == unix.NFTA_VERDICT_CHAIN {
			return strings.TrimRight(ad.String(), "\x00")
		}
	}
	return ""
}

// adopt records one element of a fixed set read back from the kernel.
func (in *installed) adopt(set string, e nftables.SetElement) {
	switch set {
	case setHost4, setHost6:
		if a, ok := netip.AddrFromSlice(e.Key); ok {
			in.host[a] = struct{}{}
		}
	case setSrc4, setSrc6:
		if len(e.Key) > 16 {
			if a, ok := netip.AddrFromSlice(e.Key[16:]); ok {
				in.src[srcElem{ifname: cString(e.Key[:16]), addr: a}] = struct{}{}
			}
		}
	case epsSet(policy.Egress):
		in.eps[cString(e.Key)] = epState{}
	}
}

func cString(b []byte) string {
	if i := slices.Index(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// adoptRecords takes over the endpoints of the previous run: their
// identities and named ports, and the remote pods its ipcache held (known
// but unconfirmed until the remote source's first full view).
func (d *Datapath) adoptRecords() error {
	recs, err := d.store.load()
	if err != nil {
		return err
	}
	local := map[netip.Addr]bool{}
	for _, r := range recs {
		id := identity.Identity{ID: r.Identity, Namespace: r.Namespace, Labels: r.Labels}
		if err := d.ids.Restore(id); err != nil {
			return fmt.Errorf("nftables datapath: adopt endpoint %q: %w", r.Key, err)
		}
		d.engine.AddLocal(id)
		d.feedNamedPorts(r)
		d.eps[r.Key] = r
		for _, ip := range r.IPs {
			local[ip] = true
		}
	}
	for a, id := range d.adoptedRemote {
		if !local[a] {
			d.remote[a] = id
			d.unconfirmed[a] = struct{}{}
		}
	}
	return nil
}

// Close stops the sweep. The table stays and keeps enforcing policy until
// the next Open adopts it, and dooms again what was left unreferenced.
func (d *Datapath) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.sweepTimer != nil {
		d.sweepTimer.Stop()
	}
	return nil
}

// Remove deletes the datapath's table in the caller's network namespace
// (uninstall); an absent table is fine.
func Remove() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables datapath: %w", err)
	}
	if _, err := c.ListTableOfFamily(TableName, nftables.TableFamilyINet); err != nil {
		if noTable(err) {
			return nil
		}
		return fmt.Errorf("nftables datapath: look for table inet %s: %w", TableName, err)
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nftables datapath: remove table inet %s: %w", TableName, err)
	}
	return nil
}

// noTable reports whether err says there is no table: none of that name,
// or no nf_tables in the kernel at all.
func noTable(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EPROTONOSUPPORT)
}

// Installed reports whether the datapath's table exists in the caller's
// network namespace.
func Installed() (bool, error) {
	c, err := nftables.New()
	if err != nil {
		return false, err
	}
	_, err = c.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if err != nil && noTable(err) {
		return false, nil
	}
	return err == nil, err
}

// --- endpoints (endpoint.Datapath) ---

// AttachEndpoint resolves ep's identity and, in one transaction, its
// chains, source addresses, ipcache entries and the policy its identity
// brings; when it returns the endpoint is enforced from its first packet.
// Repeating it for the same key updates the endpoint in place. Attaches
// that arrive while a transaction is in the kernel share the next one
// (commit_linux.go).
func (d *Datapath) AttachEndpoint(ep dpapi.Endpoint) error {
	err := d.attach(ep, false)
	if errors.Is(err, errRetryAlone) {
		// Its batch was refused: alone, its error is its own.
		err = d.attach(ep, true)
	}
	return err
}

func (d *Datapath) attach(ep dpapi.Endpoint, alone bool) error {
	r, err := newRecord(ep)
	if err != nil {
		return err
	}
	id, err := d.prepareAttach(r)
	if err != nil {
		return err
	}
	// Record first, outside the lock (its write would serialise concurrent
	// ADDs): a crash after the table has it still finds it.
	if err := d.store.put(r); err != nil {
		d.mu.Lock()
		d.ids.Release(r.Identity)
		d.mu.Unlock()
		return err
	}
	d.mu.Lock()
	err = d.attachLocked(r, id, alone)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	warnBridged(d.log, r)
	d.log.Debug("endpoint attached", zap.String("endpoint", r.Key), zap.String("interface", r.HostIfName),
		zap.Uint32("identity", uint32(r.Identity)))
	return nil
}

// attachLocked books r in and waits for the transaction that includes
// it; callers hold mu. Nothing of a refused attach is in the kernel: the
// commit undoes it here too (forget).
func (d *Datapath) attachLocked(r *record, id identity.Identity, alone bool) error {
	defer d.enterAttach(alone)()
	d.finishDetachesOf(r)
	old := d.eps[r.Key]
	d.engine.AddLocal(id)
	d.feedNamedPorts(r)
	if old != nil {
		d.engine.RemoveLocal(old.Identity)
		d.ids.Release(old.Identity)
		d.markEndpoint(old)
	}
	d.eps[r.Key] = r
	d.markEndpoint(r)
	if err := d.commitAttach(&attachWait{r: r, old: old, alone: alone}); err != nil {
		if errors.Is(err, errRetryAlone) {
			return err
		}
		return fmt.Errorf("endpoint %q: %w", r.Key, err)
	}
	d.localChanged()
	return nil
}

// prepareAttach acquires r's identity and fills in its named ports (those
// of its pod, else those of the endpoint it replaces).
func (d *Datapath) prepareAttach(r *record) (identity.Identity, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.synced {
		return identity.Identity{}, ErrPolicyNotSynced
	}
	id, _, err := d.ids.Acquire(r.Namespace, r.Labels)
	if err != nil {
		return identity.Identity{}, fmt.Errorf("endpoint %q: %w", r.Key, err)
	}
	r.Identity = id.ID
	if ports, ok := d.podPorts[r.Pod]; ok && r.Pod != "" {
		r.NamedPorts = slices.Clone(ports)
	} else if old := d.eps[r.Key]; old != nil && old.Pod == r.Pod {
		r.NamedPorts = slices.Clone(old.NamedPorts)
	}
	return id, nil
}

// forget undoes the bookkeeping of an attach whose transaction failed,
// putting back the attachment it replaced.
func (d *Datapath) forget(r, old *record) {
	if d.eps[r.Key] != r {
		return // replaced or detached since: that change owns the key now
	}
	d.engine.RemoveNamedPorts(localPortsKey(r))
	d.engine.RemoveLocal(r.Identity)
	d.ids.Release(r.Identity)
	delete(d.eps, r.Key)
	_ = d.store.delete(r.Key)
	if old != nil && !old.dying { // a dying one's detach was finished
		id := identity.Identity{ID: old.Identity, Namespace: old.Namespace, Labels: old.Labels}
		if err := d.ids.Restore(id); err == nil {
			d.engine.AddLocal(id)
			d.feedNamedPorts(old)
			d.eps[old.Key] = old
			_ = d.store.put(old)
		}
	}
	// What the engine recorded is dropped with the next flush's diff.
}

// DetachEndpoint makes ep's chains drop everything, in a transaction that
// only adds (one that deletes waits for a grace period); the sweep removes
// its chains and entries later, and an attach that reuses its interface or
// an address first (sweep_linux.go). Unknown keys are fine.
func (d *Datapath) DetachEndpoint(ep dpapi.Endpoint) error {
	if ep.Key == "" {
		return errors.New("nftables datapath: detach: endpoint key is empty")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.eps[ep.Key]
	if r == nil || r.dying {
		return nil
	}
	r.dying = true
	d.dying[r.Key] = r
	d.dirty.ifnames[r.HostIfName] = struct{}{}
	d.localChanged()
	// The record goes whatever the flush does: chains left by a refused
	// transaction are pending, and a restart removes what no record names.
	serr := d.store.delete(r.Key)
	if err := d.flush(); err != nil {
		return fmt.Errorf("endpoint %q: %w", r.Key, errors.Join(err, serr))
	}
	return serr
}

// finishDetach forgets dying endpoint r: the next flush removes its
// chains and entries as its identity's policy goes. Callers hold mu.
func (d *Datapath) finishDetach(r *record) {
	delete(d.dying, r.Key)
	if d.eps[r.Key] == r {
		delete(d.eps, r.Key)
	}
	d.engine.RemoveNamedPorts(localPortsKey(r))
	d.engine.RemoveLocal(r.Identity)
	d.ids.Release(r.Identity)
	d.markEndpoint(r)
}

// finishDetachesOf finishes, in the transaction of attach r, the detaches
// of the dying endpoints r takes the key, interface or an address of: the
// new pod must be judged by its own chains and identity from its first
// packet. Callers hold mu.
func (d *Datapath) finishDetachesOf(r *record) {
	for _, o := range d.dying {
		if o.Key == r.Key {
			delete(d.dying, o.Key) // attachLocked replaces it
			continue
		}
		if o.HostIfName == r.HostIfName || slices.ContainsFunc(o.IPs, func(a netip.Addr) bool { return slices.Contains(r.IPs, a) }) {
			d.finishDetach(o)
		}
	}
}

func (d *Datapath) localChanged() {
	if d.onLocalChange != nil {
		d.onLocalChange()
	}
}

// SetLocalChangeHook installs f, called whenever an endpoint is attached,
// moved to another identity or detached. It runs under the datapath's
// lock: it must only signal, never block or call back.
func (d *Datapath) SetLocalChangeHook(f func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.onLocalChange = f
}

// LocalIdentities returns the identity each attached endpoint holds, by
// endpoint key.
func (d *Datapath) LocalIdentities() map[string]identity.ID {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]identity.ID, len(d.eps))
	for k, r := range d.eps {
		if !r.dying {
			out[k] = r.Identity
		}
	}
	return out
}

// Collectors are the datapath's metrics: the policies of the last
// snapshot (valid and invalid), its transactions and the ones the kernel
// refused, its drops.
func (d *Datapath) Collectors() []prometheus.Collector {
	read := func(f func(stats) uint64) func() float64 {
		return func() float64 {
			d.mu.Lock()
			defer d.mu.Unlock()
			return float64(f(d.stats))
		}
	}
	descs := [2]*prometheus.Desc{
		prometheus.NewDesc("coordino_datapath_packets_total",
			"Packets the nftables datapath dropped, by direction (of the pod), verdict and reason (the eBPF datapath's names).",
			[]string{"direction", "verdict", "reason"}, nil),
		prometheus.NewDesc("coordino_datapath_bytes_total",
			"Bytes the nftables datapath dropped, by direction (of the pod), verdict and reason.",
			[]string{"direction", "verdict", "reason"}, nil),
	}
	snap := func(f func(*policy.SnapshotState) int) func() float64 {
		return func() float64 {
			d.snapMu.Lock()
			defer d.snapMu.Unlock()
			return float64(f(&d.snap))
		}
	}
	return []prometheus.Collector{
		&dropCollector{d: d, descs: descs},
		// The eBPF datapath's names: dashboards and alerts hold for both.
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "coordino_policy_invalid",
			Help: "Network policies skipped by the last compilation because they are invalid."},
			snap(func(s *policy.SnapshotState) int { return len(s.Invalid) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "coordino_policies",
			Help: "Valid network policies in the policy engine (the last snapshot applied)."},
			snap(func(s *policy.SnapshotState) int { return len(s.Policies) })),
		// The eBPF datapath's name: flow events the daemon never read.
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "coordino_flow_events_lost_total",
			Help: "Flow log messages lost because the daemon's socket buffer was full."}, d.flowLost),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "coordino_nftables_transactions_total",
			Help: "nftables transactions the nftables datapath sent (one per policy, identity or endpoint change)."},
			read(func(s stats) uint64 { return s.transactions })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "coordino_nftables_transaction_failures_total",
			Help: "nftables transactions the kernel refused; the previous policy stayed in force and the change is retried with the next one."},
			read(func(s stats) uint64 { return s.failures })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "coordino_nftables_sweeps_total",
			Help: "nftables transactions that deleted chains and sets no longer referenced (one for all those left since the last)."},
			read(func(s stats) uint64 { return s.sweeps })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "coordino_nftables_sweep_failures_total",
			Help: "Sweeps the kernel refused; the objects stay unreferenced, policy in force is unchanged, and the sweep is retried."},
			read(func(s stats) uint64 { return s.sweepFailures })),
	}
}

// Endpoints returns the keys of all attached endpoints, including those
// adopted from the previous run.
func (d *Datapath) Endpoints() ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var keys []string
	for k, r := range d.eps {
		if !r.dying {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys, nil
}

// AttachCapacity never fails: sets grow as needed.
func (d *Datapath) AttachCapacity() error { return nil }

// markEndpoint queues r's chains and addresses.
func (d *Datapath) markEndpoint(r *record) {
	d.dirty.ifnames[r.HostIfName] = struct{}{}
	for _, ip := range r.IPs {
		d.dirty.addrs[ip] = struct{}{}
	}
}

// SetNodeIPs replaces the node's addresses (the host identity).
func (d *Datapath) SetNodeIPs(ips []netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	ips = unmapAll(ips)
	for _, ip := range slices.Concat(d.nodeIPs, ips) {
		d.dirty.addrs[ip] = struct{}{}
	}
	d.nodeIPs = ips
	return d.flush()
}

// --- policy (controlplane.Sink) ---

// UpdatePolicy replaces the policy snapshot: the objects that changed are
// fed to the engine and the resulting differences written in one
// transaction. Invalid policies are skipped and reported in the error;
// valid ones are applied regardless.
func (d *Datapath) UpdatePolicy(s policy.Snapshot) error {
	d.snapMu.Lock()
	defer d.snapMu.Unlock()
	delta, invalid := d.snap.Diff(s)
	d.mu.Lock()
	defer d.mu.Unlock()
	delta.Feed(d.engine)
	invalid = errors.Join(invalid, d.setNodeIsolation(s.NodeIsolation))
	if !d.synced {
		d.synced = true
		d.dirty.all = true
	}
	if err := d.flush(); err != nil {
		return fmt.Errorf("nftables datapath: apply policy: %w", errors.Join(err, invalid))
	}
	return invalid
}

// NotEnforced says which policies of the last snapshot this datapath
// does not enforce (coordinoctl status shows it as a problem): none, it
// enforces NetworkPolicy, both ClusterNetworkPolicy tiers and
// NodeIsolationPolicy.
func (d *Datapath) NotEnforced() string { return "" }

// --- Kubernetes (k8s.Sink) ---

// UpsertIdentity makes id known as a possible policy peer.
func (d *Datapath) UpsertIdentity(id identity.Identity) error {
	if id.ID < identity.FirstPod || id.ID.IsCIDR() {
		return fmt.Errorf("nftables datapath: upsert identity %d: not a pod identity", id.ID)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.engine.UpsertIdentity(id)
	return d.flush()
}

// DeleteIdentity forgets an identity announced by UpsertIdentity.
func (d *Datapath) DeleteIdentity(id identity.ID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.engine.DeleteIdentity(id)
	return d.flush()
}

func localPortsKey(r *record) string { return "local/" + r.Key }

// feedNamedPorts tells the engine endpoint r's ports under its identity.
func (d *Datapath) feedNamedPorts(r *record) {
	if len(r.NamedPorts) == 0 {
		d.engine.RemoveNamedPorts(localPortsKey(r))
		return
	}
	d.engine.SetNamedPorts(policy.PodPorts{Key: localPortsKey(r), ID: r.Identity, Local: true, Ports: r.NamedPorts})
}

// SetPodNamedPorts sets the named container ports of this node's pod
// ("namespace/name"); nil or empty forgets them.
func (d *Datapath) SetPodNamedPorts(pod string, ports []policy.NamedPort) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(ports) == 0 {
		delete(d.podPorts, pod)
	} else {
		d.podPorts[pod] = slices.Clone(ports)
	}
	for _, r := range d.eps {
		if r.dying || r.Pod != pod || slices.Equal(r.NamedPorts, ports) {
			continue
		}
		r.NamedPorts = slices.Clone(ports)
		d.feedNamedPorts(r)
		if err := d.store.put(r); err != nil {
			d.log.Warn("named ports not saved in the endpoint's record", zap.String("endpoint", r.Key), zap.Error(err))
		}
	}
	return d.flush()
}

// SetPeerNamedPorts sets the named ports of a pod elsewhere holding
// identity id; key names that pod uniquely. Nil or empty forgets them.
func (d *Datapath) SetPeerNamedPorts(key string, id identity.ID, ports []policy.NamedPort) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(ports) == 0 {
		d.engine.RemoveNamedPorts("peer/" + key)
	} else {
		d.engine.SetNamedPorts(policy.PodPorts{Key: "peer/" + key, ID: id, Ports: ports})
	}
	return d.flush()
}

// UpdateRemoteEndpoints sets the identity of the remote pod addresses in
// upsert and forgets those in remove.
func (d *Datapath) UpdateRemoteEndpoints(upsert map[netip.Addr]identity.ID, remove []netip.Addr) error {
	for a, id := range upsert {
		if id < identity.FirstPod || id > identity.LastCluster {
			return fmt.Errorf("nftables datapath: remote endpoint %s: identity %d is not a cluster identity", a, id)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, a := range remove {
		a = a.Unmap()
		delete(d.remote, a)
		delete(d.unconfirmed, a)
		d.dirty.addrs[a] = struct{}{}
	}
	for a, id := range upsert {
		a = a.Unmap()
		d.remote[a] = id
		delete(d.unconfirmed, a)
		d.dirty.addrs[a] = struct{}{}
	}
	return d.flush()
}

// RemoteEndpointsSynced drops the remote addresses adopted at start that
// the remote source did not confirm.
func (d *Datapath) RemoteEndpointsSynced() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for a := range d.unconfirmed {
		delete(d.remote, a)
		d.dirty.addrs[a] = struct{}{}
	}
	clear(d.unconfirmed)
	return d.flush()
}

// dropCollector reads the table's drop counters at each scrape.
type dropCollector struct {
	d     *Datapath
	descs [2]*prometheus.Desc // packets, bytes
}

func (c *dropCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *dropCollector) Collect(ch chan<- prometheus.Metric) {
	counts, err := c.d.drops()
	if err != nil {
		for _, d := range c.descs {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	for name, n := range counts {
		dir, reason, _ := strings.Cut(name, "-")
		ch <- prometheus.MustNewConstMetric(c.descs[0], prometheus.CounterValue, float64(n.Packets), dir, "dropped", reason)
		ch <- prometheus.MustNewConstMetric(c.descs[1], prometheus.CounterValue, float64(n.Bytes), dir, "dropped", reason)
	}
}

// Drops returns the packets dropped so far by "<direction>-<reason>"
// ("egress-spoofed", "ingress-policy-denied", "egress-policy-revoked"...).
func (d *Datapath) Drops() (map[string]uint64, error) {
	counts, err := d.drops()
	out := map[string]uint64{}
	for name, c := range counts {
		out[name] = c.Packets
	}
	return out, err
}

func (d *Datapath) drops() (map[string]*expr.Counter, error) {
	// Named objects: the table holds limits too, which the legacy
	// counter-only listing cannot parse.
	objs, err := d.conn.GetNamedObjects(d.lay.table)
	if err != nil {
		return nil, fmt.Errorf("nftables datapath: read drop counters: %w", err)
	}
	out := map[string]*expr.Counter{}
	for _, o := range objs {
		n, ok := o.(*nftables.NamedObj)
		if !ok || n.Type != nftables.ObjTypeCounter || !slices.Contains(dropCounters(), n.Name) {
			continue
		}
		if c, ok := n.Obj.(*expr.Counter); ok {
			out[n.Name] = c
		}
	}
	return out, nil
}

// warnBridged says that a pod interface enslaved to a bridge (a chained
// setup over a bridge CNI) is not enforced: traffic between the bridge's
// ports never reaches the inet hooks, and routed traffic names the bridge,
// not the port, unless br_netfilter is loaded.
func warnBridged(log *zap.Logger, r *record) {
	l, err := vnetlink.LinkByName(r.HostIfName)
	if err != nil || l.Attrs().MasterIndex == 0 {
		return
	}
	log.Warn("pod interface is a bridge port: the nftables datapath does not see its traffic (docs/architecture.md, the nftables datapath)",
		zap.String("endpoint", r.Key), zap.String("interface", r.HostIfName))
}
