package endpoint

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/coordino/coordino/daemon/chaining"
	"github.com/coordino/coordino/daemon/datapath/dpapi"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/store"
)

// fakeNode is the node as the manager sees it through PodNetwork and
// Datapath, in memory: pod namespaces, pins, veths and attached endpoints.
// Each operation can be made to fail (fail) or to run a test's code when it
// starts (hook, to block it or to interleave another request there), and
// every operation is logged in the order it happened. It keeps the promises
// of the real parts (SetupPod leaves nothing on error, Teardown and Unpin
// of what is absent succeed) and notes every request that finds state a
// correct manager never leaves for it (violations).
type fakeNode struct {
	mu         sync.Mutex
	namespaces map[string]bool               // pod netns paths that exist
	pins       map[string]string             // pin path -> netns path
	veths      map[string]*fakeVeth          // host name -> pair
	attached   map[string]dpapi.Endpoint     // key -> endpoint
	peers      map[string]*chaining.HostPeer // netns path + "|" + ifname -> another plugin's host peer
	broken     map[string]error              // host name -> what CheckPod reports
	nextIndex  int
	failures   map[string]error
	hooks      map[string]func(subject string)
	ops        []string
	violations []string
}

type fakeVeth struct {
	netns, ifName string
	index         int
	addrs         []netip.Prefix
}

// Operation names, for fail, hook and the log.
const (
	opVerify    = "verify"
	opPin       = "pin"
	opUnpin     = "unpin"
	opSetup     = "setup"     // creating the veth pair
	opConfigure = "configure" // addresses, routes and neighbours on the pair, alongside the attach
	opTeardown  = "teardown"
	opResolve   = "resolve"
	opAttach    = "attach"
	opDetach    = "detach"
	opCommit    = "commit" // store Put
	opDelete    = "delete" // store Delete
	opGet       = "get"    // store Get
)

func newFakeNode() *fakeNode {
	return &fakeNode{
		namespaces: map[string]bool{}, pins: map[string]string{}, veths: map[string]*fakeVeth{},
		attached: map[string]dpapi.Endpoint{}, peers: map[string]*chaining.HostPeer{}, broken: map[string]error{},
		failures: map[string]error{}, hooks: map[string]func(string){}, nextIndex: 100,
	}
}

// addNamespace makes a pod network namespace exist at path.
func (n *fakeNode) addNamespace(path string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.namespaces[path] = true
}

// fail makes every later op fail with err (nil: succeed again).
func (n *fakeNode) fail(op string, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err == nil {
		delete(n.failures, op)
		return
	}
	n.failures[op] = err
}

// hook runs f, outside the node's lock, whenever op starts.
func (n *fakeNode) hook(op string, f func(subject string)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hooks[op] = f
}

// begin logs op on subject, runs its hook and returns its injected failure.
func (n *fakeNode) begin(op, subject string) error {
	n.mu.Lock()
	n.ops = append(n.ops, op+" "+subject)
	h, err := n.hooks[op], n.failures[op]
	n.mu.Unlock()
	if h != nil {
		h(subject)
	}
	if err != nil {
		return fmt.Errorf("injected %s failure on %s: %w", op, subject, err)
	}
	return nil
}

func (n *fakeNode) violate(format string, args ...any) {
	n.violations = append(n.violations, fmt.Sprintf(format, args...))
}

func (n *fakeNode) VerifyPodNetns(path string) error {
	if err := n.begin(opVerify, path); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.namespaces[path] {
		return fmt.Errorf("%s is not a network namespace", path)
	}
	return nil
}

func (n *fakeNode) VerifyPin(pinPath string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ns, ok := n.pins[pinPath]; !ok || !n.namespaces[ns] {
		return fmt.Errorf("%s is not a network namespace", pinPath)
	}
	return nil
}

func (n *fakeNode) Pin(nsPath, pinPath string) error {
	if err := n.begin(opPin, pinPath); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.pins[pinPath]; ok {
		n.violate("pin %s: already pinned", pinPath)
	}
	n.pins[pinPath] = nsPath
	return nil
}

func (n *fakeNode) Unpin(pinPath string) error {
	if err := n.begin(opUnpin, pinPath); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.pins, pinPath)
	return nil
}

func (n *fakeNode) ListPins(dir string) ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for p := range n.pins {
		if filepath.Dir(p) == dir {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out, nil
}

// SetupPod creates the pair, then runs WhileConfiguring alongside the
// configuration of both ends, as netsetup does; on error the pair goes.
func (n *fakeNode) SetupPod(cfg netsetup.PodConfig) (*netsetup.Attachment, error) {
	if err := n.begin(opSetup, cfg.HostIfName); err != nil {
		return nil, err
	}
	n.mu.Lock()
	if _, ok := n.pins[cfg.NetNSPath]; !ok {
		n.violate("setup %s: netns %s is not pinned", cfg.HostIfName, cfg.NetNSPath)
	}
	if _, ok := n.veths[cfg.HostIfName]; ok {
		n.violate("setup %s: a veth of that name is live", cfg.HostIfName)
	}
	n.nextIndex++
	v := &fakeVeth{netns: cfg.NetNSPath, ifName: cfg.IfName, index: n.nextIndex, addrs: cfg.Addrs}
	n.veths[cfg.HostIfName] = v
	n.mu.Unlock()

	att := &netsetup.Attachment{HostIfName: cfg.HostIfName, HostIfIndex: v.index, PodIfIndex: v.index + 1,
		HostMAC: net.HardwareAddr{2, 0, 0, 0, 0, byte(v.index)}, PodMAC: net.HardwareAddr{2, 0, 0, 0, 1, byte(v.index)}, MTU: cfg.MTU}
	alongside := make(chan error, 1)
	go func() {
		if cfg.WhileConfiguring == nil {
			alongside <- nil
			return
		}
		alongside <- cfg.WhileConfiguring(att.HostIfIndex, att.HostMAC, att.PodMAC)
	}()
	err := n.begin(opConfigure, cfg.HostIfName)
	if aerr := <-alongside; err == nil {
		err = aerr
	}
	if err != nil {
		n.mu.Lock()
		delete(n.veths, cfg.HostIfName)
		n.mu.Unlock()
		return nil, err
	}
	return att, nil
}

func (n *fakeNode) TeardownPod(hostIfName string) error {
	if err := n.begin(opTeardown, hostIfName); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.veths, hostIfName)
	return nil
}

func (n *fakeNode) CheckPod(cfg netsetup.PodConfig) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	v, ok := n.veths[cfg.HostIfName]
	if !ok {
		return fmt.Errorf("host veth %s: not found", cfg.HostIfName)
	}
	var problems []error
	if v.netns != cfg.NetNSPath || v.ifName != cfg.IfName {
		problems = append(problems, fmt.Errorf("pod end of %s is %s in %s, want %s in %s", cfg.HostIfName, v.ifName, v.netns, cfg.IfName, cfg.NetNSPath))
	}
	if err := n.broken[cfg.HostIfName]; err != nil {
		problems = append(problems, err)
	}
	return errors.Join(problems...)
}

func (n *fakeNode) ListHostVeths() ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for name := range n.veths {
		out = append(out, name)
	}
	slices.Sort(out)
	return out, nil
}

// addPeer makes another plugin's veth: ifname in netns, host end hostName.
func (n *fakeNode) addPeer(netns, ifname, hostName string, podAddrs ...netip.Addr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.namespaces[netns] = true
	n.nextIndex++
	n.peers[netns+"|"+ifname] = &chaining.HostPeer{Name: hostName, Index: n.nextIndex, PodAddrs: podAddrs}
}

func (n *fakeNode) ResolveHostPeer(netnsPath, ifname string, podAddrs bool) (*chaining.HostPeer, error) {
	if err := n.begin(opResolve, netnsPath+"|"+ifname); err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.peers[netnsPath+"|"+ifname]
	if !ok {
		return nil, fmt.Errorf("no interface %s in %s", ifname, netnsPath)
	}
	out := *p
	if !podAddrs {
		out.PodAddrs = nil
	}
	return &out, nil
}

func (n *fakeNode) HostInterface(name string) (int, net.HardwareAddr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if v, ok := n.veths[name]; ok {
		return v.index, net.HardwareAddr{2, 0, 0, 0, 0, byte(v.index)}, nil
	}
	for _, p := range n.peers {
		if p.Name == name {
			return p.Index, nil, nil
		}
	}
	return 0, nil, fmt.Errorf("link %s not found", name)
}

func (n *fakeNode) PodMACs() (map[int]net.HardwareAddr, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[int]net.HardwareAddr{}
	for _, v := range n.veths {
		out[v.index] = net.HardwareAddr{2, 0, 0, 0, 1, byte(v.index)}
	}
	return out, nil
}

func (n *fakeNode) AttachEndpoint(ep dpapi.Endpoint) error {
	if err := n.begin(opAttach, ep.Key); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if ep.HostIfIndex == 0 {
		n.violate("attach %s: no host interface index", ep.Key)
	}
	n.attached[ep.Key] = ep
	return nil
}

func (n *fakeNode) DetachEndpoint(ep dpapi.Endpoint) error {
	if err := n.begin(opDetach, ep.Key); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.attached, ep.Key)
	return nil
}

func (n *fakeNode) Endpoints() ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for k := range n.attached {
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}

func (n *fakeNode) AttachCapacity() error { return nil }

// faultyStore is the real store, logged, failing and hooked through the
// node's get, commit and delete operations.
type faultyStore struct {
	*store.Store
	node *fakeNode
}

func (s faultyStore) Put(ep *store.Endpoint) error {
	if err := s.node.begin(opCommit, ep.Key.String()); err != nil {
		return err
	}
	return s.Store.Put(ep)
}

func (s faultyStore) Get(k store.Key) (*store.Endpoint, error) {
	if err := s.node.begin(opGet, k.String()); err != nil {
		return nil, err
	}
	return s.Store.Get(k)
}

func (s faultyStore) Delete(k store.Key) error {
	if err := s.node.begin(opDelete, k.String()); err != nil {
		return err
	}
	return s.Store.Delete(k)
}

// fixture is a Manager over a fake node, the real store and a real pool.
type fixture struct {
	t     *testing.T
	m     *Manager
	node  *fakeNode
	store *store.Store
	pool  *ipam.Pool
}

const fixturePinDir = "/run/test/netns"

// newFixture returns a Manager with a datapath over cidr's addresses.
func newFixture(t *testing.T, cidr string) *fixture {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	pool, err := ipam.NewPool([]netip.Prefix{netip.MustParsePrefix(cidr)})
	if err != nil {
		t.Fatal(err)
	}
	node := newFakeNode()
	m := New(Config{PinDir: fixturePinDir, Pool: pool, Store: faultyStore{st, node}, Network: node, Datapath: node, DefaultMTU: 1500})
	f := &fixture{t: t, m: m, node: node, store: st, pool: pool}
	t.Cleanup(f.noViolations)
	return f
}

func (f *fixture) noViolations() {
	f.node.mu.Lock()
	defer f.node.mu.Unlock()
	for _, v := range f.node.violations {
		f.t.Errorf("the manager left state another request then found: %s", v)
	}
}

// pod returns a key and a netns that exists for it.
func (f *fixture) pod(name string) (store.Key, string) {
	netns := "/var/run/netns/" + name
	f.node.addNamespace(netns)
	return store.Key{Network: "net", ContainerID: name, IfName: "eth0"}, netns
}

// leftovers lists what remains of attachments: records, reserved
// addresses, pins, veths and attached endpoints.
func (f *fixture) leftovers() []string {
	f.t.Helper()
	var out []string
	eps, err := f.store.List("")
	if err != nil {
		f.t.Fatal(err)
	}
	for _, ep := range eps {
		out = append(out, "record "+ep.Key.String())
	}
	for _, u := range f.pool.Usage() {
		if u.Used > 0 {
			out = append(out, fmt.Sprintf("%d addresses reserved in %v", u.Used, u.Prefix))
		}
	}
	f.node.mu.Lock()
	defer f.node.mu.Unlock()
	for p := range f.node.pins {
		out = append(out, "pin "+p)
	}
	for v := range f.node.veths {
		out = append(out, "veth "+v)
	}
	for k := range f.node.attached {
		out = append(out, "datapath endpoint "+k)
	}
	slices.Sort(out)
	return out
}

// opsOf returns the logged operations, in order.
func (f *fixture) opsOf() []string {
	f.node.mu.Lock()
	defer f.node.mu.Unlock()
	return slices.Clone(f.node.ops)
}
