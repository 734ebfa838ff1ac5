package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/coordino/coordino/daemon/chaining"
	"github.com/coordino/coordino/daemon/datapath/dpapi"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
)

// These tests drive the manager's verbs against a fake node (fakes_test.go)
// and the real store and IPAM, without root. What they prove is the
// manager's own logic: the order of its steps, what it undoes, what it
// serialises; the kernel side is proved as root in netsetup, netns,
// chaining, datapath and test/e2e.

var errInjected = errors.New("injected")

// fullError is a datapath at capacity (dpapi.FullError).
type fullError struct{}

func (fullError) Error() string {
	return "table cdo_endpoints is full (capacity 1): raise --endpoints-map-size"
}
func (fullError) DatapathFull() {}

func cniCode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// mustRun fails t unless every op in want was logged: the state an undo
// must remove really existed.
func mustRun(t *testing.T, f *fixture, want ...string) {
	t.Helper()
	ops := f.opsOf()
	for _, w := range want {
		if !slices.ContainsFunc(ops, func(op string) bool { return strings.HasPrefix(op, w+" ") }) {
			t.Errorf("%s never ran (ops %q): the case does not test the undo it names", w, ops)
		}
	}
}

// Every step of a primary ADD can fail; whichever does, the ADD fails with
// the code that step calls for and leaves nothing: no record, no reserved
// address, no pin, no veth, nothing attached.
func TestPrimaryAddFailureLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(f *fixture)
		code    uint
		ran     []string // steps that made state the undo must remove
	}{
		{"netns", func(f *fixture) { f.node.fail(opVerify, errInjected) }, types.ErrInvalidEnvironmentVariables, nil},
		{"allocate", func(f *fixture) {
			for range 2 { // a /30 holds two
				if _, err := f.pool.Allocate(); err != nil {
					t.Fatal(err)
				}
			}
		}, types.ErrTryAgainLater, nil},
		{"commit", func(f *fixture) { f.node.fail(opCommit, errInjected) }, types.ErrInternal, []string{opPin, opSetup, opAttach}},
		{"pin", func(f *fixture) { f.node.fail(opPin, errInjected) }, types.ErrInternal, []string{opCommit}},
		{"veth", func(f *fixture) { f.node.fail(opSetup, errInjected) }, types.ErrInternal, []string{opCommit, opPin}},
		{"routes", func(f *fixture) { f.node.fail(opConfigure, errInjected) }, types.ErrInternal, []string{opCommit, opPin, opAttach}},
		{"attach", func(f *fixture) { f.node.fail(opAttach, errInjected) }, types.ErrInternal, []string{opCommit, opPin, opSetup}},
		{"attach full", func(f *fixture) { f.node.fail(opAttach, fullError{}) }, types.ErrTryAgainLater, []string{opCommit, opPin, opSetup}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "10.1.0.0/30")
			key, netns := f.pod("p")
			tc.prepare(f)
			before := f.leftovers()
			_, err := f.m.Add(context.Background(), addInvocation(key, netns))
			if cniCode(err) != tc.code {
				t.Fatalf("ADD = %v, want CNI code %d", err, tc.code)
			}
			mustRun(t, f, tc.ran...)
			if after := f.leftovers(); !slices.Equal(after, before) {
				t.Fatalf("a failed ADD left %q (before it: %q)", after, before)
			}
		})
	}
}

// A failed ADD's undo runs after the record's commit has finished, even
// when the ADD failed first: an undo that deleted the record before the
// commit wrote it would leave a record of nothing.
func TestPrimaryAddUndoWaitsForTheCommit(t *testing.T) {
	f := newFixture(t, "10.1.0.0/30")
	key, netns := f.pod("p")
	commitMayFinish := make(chan struct{})
	f.node.hook(opCommit, func(string) { <-commitMayFinish })
	f.node.fail(opPin, errInjected)
	done := make(chan error, 1)
	go func() {
		_, err := f.m.Add(context.Background(), addInvocation(key, netns))
		done <- err
	}()
	select {
	case err := <-done:
		close(commitMayFinish)
		t.Fatalf("ADD returned (%v) while its record was still being committed", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(commitMayFinish)
	if err := <-done; err == nil {
		t.Fatal("ADD with a failing pin succeeded")
	}
	if left := f.leftovers(); len(left) > 0 {
		t.Fatalf("a failed ADD left %q", left)
	}
}

// An undo that cannot finish keeps the record, so that the DEL the runtime
// sends next (or GC) finds the attachment and finishes the job.
func TestFailedUndoKeepsTheRecordForDel(t *testing.T) {
	f := newFixture(t, "10.1.0.0/30")
	key, netns := f.pod("p")
	f.node.fail(opAttach, errInjected)
	f.node.fail(opTeardown, errInjected)
	if _, err := f.m.Add(context.Background(), addInvocation(key, netns)); err == nil {
		t.Fatal("ADD with a failing attach succeeded")
	}
	if _, err := f.store.Get(key); err != nil {
		t.Fatalf("the undo could not remove the veth, yet the record went: %v", err)
	}
	f.node.fail(opAttach, nil)
	if err := f.m.Del(context.Background(), &request.Invocation{Verb: request.Del, Key: key}); err == nil {
		t.Fatal("DEL whose veth removal fails succeeded")
	}
	if _, err := f.store.Get(key); err != nil {
		t.Fatalf("a DEL that failed removed the record: %v", err)
	}
	f.node.fail(opTeardown, nil)
	if err := f.m.Del(context.Background(), &request.Invocation{Verb: request.Del, Key: key}); err != nil {
		t.Fatal(err)
	}
	if left := f.leftovers(); len(left) > 0 {
		t.Fatalf("DEL after a failed undo left %q", left)
	}
}

func chainedInvocation(key store.Key, netns string, named bool, addrs ...string) *request.Invocation {
	prev := &current.Result{CNIVersion: "1.1.0"}
	if named {
		prev.Interfaces = []*current.Interface{{Name: key.IfName, Sandbox: netns}}
	}
	for _, a := range addrs {
		p := netip.MustParsePrefix(a)
		ip := &current.IPConfig{Address: net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if named {
			ip.Interface = current.Int(0)
		}
		prev.IPs = append(prev.IPs, ip)
	}
	inv := addInvocation(key, netns)
	inv.PrevResult = prev
	return inv
}

// A chained ADD makes only a record and a datapath endpoint, side by side;
// whichever fails, neither remains, and the primary's interface is left alone.
func TestChainedAddFailureLeavesNothing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(f *fixture)
		code    uint
		ran     []string
	}{
		{"netns", func(f *fixture) { f.node.fail(opVerify, errInjected) }, types.ErrInvalidEnvironmentVariables, nil},
		{"host peer", func(f *fixture) { f.node.fail(opResolve, errInjected) }, types.ErrInternal, nil},
		{"not a veth", func(f *fixture) { f.node.fail(opResolve, &chaining.ErrNotVeth{IfName: "eth0", Kind: "macvlan"}) }, types.ErrInvalidNetworkConfig, nil},
		{"commit", func(f *fixture) { f.node.fail(opCommit, errInjected) }, types.ErrInternal, []string{opAttach}},
		{"attach", func(f *fixture) { f.node.fail(opAttach, errInjected) }, types.ErrInternal, []string{opCommit}},
		{"attach full", func(f *fixture) { f.node.fail(opAttach, fullError{}) }, types.ErrTryAgainLater, []string{opCommit}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, "10.1.0.0/30")
			key := store.Key{Network: "net", ContainerID: "c", IfName: "eth0"}
			f.node.addPeer("/var/run/netns/c", "eth0", "veth-primary", netip.MustParseAddr("10.9.0.5"))
			tc.prepare(f)
			before := f.leftovers()
			_, err := f.m.Add(context.Background(), chainedInvocation(key, "/var/run/netns/c", true, "10.9.0.5/24"))
			if cniCode(err) != tc.code {
				t.Fatalf("chained ADD = %v, want CNI code %d", err, tc.code)
			}
			mustRun(t, f, tc.ran...)
			if after := f.leftovers(); !slices.Equal(after, before) {
				t.Fatalf("a failed chained ADD left %q (before it: %q)", after, before)
			}
		})
	}
}

// A chained ADD records the addresses the kernel shows on the pod
// interface when prevResult does not name it, attaches to its host peer and
// passes prevResult through.
func TestChainedAddAttachesToTheHostPeer(t *testing.T) {
	f := newFixture(t, "10.1.0.0/30")
	key := store.Key{Network: "net", ContainerID: "c", IfName: "eth0"}
	f.node.addPeer("/var/run/netns/c", "eth0", "veth-primary", netip.MustParseAddr("10.9.0.5"))
	out, err := f.m.Add(context.Background(), chainedInvocation(key, "/var/run/netns/c", false, "10.9.0.5/24", "10.9.0.6/24"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "10.9.0.6/24") {
		t.Errorf("result %s is not prevResult passed through", out)
	}
	ep, err := f.store.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	if ep.HostIfName != "veth-primary" || !slices.Equal(ep.IPs, []netip.Prefix{netip.MustParsePrefix("10.9.0.5/32")}) {
		t.Errorf("record: host interface %s, addresses %v; want veth-primary, the one on the pod interface", ep.HostIfName, ep.IPs)
	}
	f.node.mu.Lock()
	att := f.node.attached[key.String()]
	f.node.mu.Unlock()
	if att.HostIfName != "veth-primary" || att.HostIfIndex == 0 {
		t.Errorf("datapath endpoint %+v, want it on veth-primary", att)
	}
}

// waitFor waits for ch, failing t after a while: a step that should run
// side by side with another never started.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(2 * time.Second):
		t.Errorf("%s never happened", what)
	}
}

// The record's commit, the veth's configuration and the datapath attach of
// one ADD run side by side: each of the three waits here until the others
// have started, which only completes if none waits for another to finish.
func TestPrimaryAddCommitsSetsUpAndAttachesSideBySide(t *testing.T) {
	f := newFixture(t, "10.1.0.0/30")
	key, netns := f.pod("p")
	started := map[string]chan struct{}{opCommit: make(chan struct{}), opConfigure: make(chan struct{}), opAttach: make(chan struct{})}
	for op := range started {
		f.node.hook(op, func(string) {
			close(started[op])
			for other, ch := range started {
				if other != op {
					waitFor(t, ch, other+" alongside "+op)
				}
			}
		})
	}
	if _, err := f.m.Add(context.Background(), addInvocation(key, netns)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Get(key); err != nil {
		t.Fatalf("ADD returned before its record was durable: %v", err)
	}
}

// Two requests for one attachment never interleave: a DEL and a second ADD
// sent while an ADD is setting up the veth wait for it, then run in turn.
func TestOneAttachmentIsSerialised(t *testing.T) {
	f := newFixture(t, "10.1.0.0/29")
	key, netns := f.pod("p")
	inSetup, mayGoOn := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.node.hook(opSetup, func(string) {
		once.Do(func() { close(inSetup); <-mayGoOn })
	})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := f.m.Add(context.Background(), addInvocation(key, netns)); err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, inSetup, "the first ADD's setup")
	opsBefore := len(f.opsOf())
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := f.m.Del(context.Background(), &request.Invocation{Verb: request.Del, Key: key}); err != nil {
			t.Error(err)
		}
	}()
	go func() {
		defer wg.Done()
		if _, err := f.m.Add(context.Background(), addInvocation(key, netns)); err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(100 * time.Millisecond)
	// Only the held ADD's own commit may run meanwhile.
	others := slices.DeleteFunc(f.opsOf()[opsBefore:], func(op string) bool { return strings.HasPrefix(op, opCommit+" ") })
	if len(others) > 0 {
		t.Errorf("while an ADD of %s was setting up, other requests for it ran %q", key, others)
	}
	close(mayGoOn)
	wg.Wait()
	// Whichever of DEL and ADD went last, state and record agree.
	if _, err := f.store.Get(key); err == nil {
		mustBeAttached(t, f, key)
	} else if left := f.leftovers(); len(left) > 0 {
		t.Errorf("no record, yet %q remain", left)
	}
}

// mustBeAttached fails t unless key's record, address, pin, veth and
// datapath endpoint all exist.
func mustBeAttached(t *testing.T, f *fixture, key store.Key) {
	t.Helper()
	ep, err := f.store.Get(key)
	if err != nil {
		t.Fatalf("record of %s: %v", key, err)
	}
	for _, ip := range ep.IPs {
		if !f.pool.InUse(ip.Addr()) {
			t.Errorf("%s: address %v not reserved", key, ip)
		}
	}
	f.node.mu.Lock()
	defer f.node.mu.Unlock()
	if _, ok := f.node.pins[ep.PinPath]; !ok {
		t.Errorf("%s: no pin %s", key, ep.PinPath)
	}
	if _, ok := f.node.veths[ep.HostIfName]; !ok {
		t.Errorf("%s: no veth %s", key, ep.HostIfName)
	}
	if _, ok := f.node.attached[key.String()]; !ok {
		t.Errorf("%s: no datapath endpoint", key)
	}
}

// Different attachments proceed in parallel: an ADD held in its setup does
// not hold up another pod's.
func TestDifferentAttachmentsRunInParallel(t *testing.T) {
	f := newFixture(t, "10.1.0.0/29")
	a, nsA := f.pod("a")
	b, nsB := f.pod("b")
	hostA := netsetup.HostIfName(a.Network, a.ContainerID, a.IfName)
	bInSetup := make(chan struct{})
	f.node.hook(opSetup, func(name string) {
		if name == hostA {
			waitFor(t, bInSetup, "the setup of "+b.String()+" while "+a.String()+"'s was running")
		} else {
			close(bInSetup)
		}
	})
	var wg sync.WaitGroup
	for _, p := range []struct {
		k  store.Key
		ns string
	}{{a, nsA}, {b, nsB}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p.k == b {
				time.Sleep(20 * time.Millisecond) // a first
			}
			if _, err := f.m.Add(context.Background(), addInvocation(p.k, p.ns)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	mustBeAttached(t, f, a)
	mustBeAttached(t, f, b)
}

// Many ADDs and DELs of a few attachments at once, with the race detector:
// at every step the node holds only what one request of the key left
// (the fake notes a pin or veth found live, or an attach without an
// interface), addresses are never given twice, and after a DEL of each
// nothing remains.
func TestConcurrentAddDel(t *testing.T) {
	f := newFixture(t, "10.1.0.0/26")
	const pods, rounds = 6, 30
	var wg sync.WaitGroup
	for i := range pods {
		key, netns := f.pod(fmt.Sprintf("pod-%d", i))
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range rounds {
					var err error
					if (r+w)%3 == 2 {
						err = f.m.Del(context.Background(), &request.Invocation{Verb: request.Del, Key: key})
					} else {
						_, err = f.m.Add(context.Background(), addInvocation(key, netns))
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	eps, err := f.store.List("")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Prefix]string{}
	for _, ep := range eps {
		mustBeAttached(t, f, ep.Key)
		for _, ip := range ep.IPs {
			if other, dup := seen[ip]; dup {
				t.Errorf("%v is held by %s and %s", ip, other, ep.Key)
			}
			seen[ip] = ep.Key.String()
		}
	}
	for i := range pods {
		key, _ := f.pod(fmt.Sprintf("pod-%d", i))
		if err := f.m.Del(context.Background(), &request.Invocation{Verb: request.Del, Key: key}); err != nil {
			t.Fatal(err)
		}
	}
	if left := f.leftovers(); len(left) > 0 {
		t.Fatalf("after a DEL of every pod, %q remain", left)
	}
}

// DEL succeeds for what is not there, as often as it is sent, and also when
// part of the attachment is already gone.
func TestDelIsIdempotent(t *testing.T) {
	f := newFixture(t, "10.1.0.0/30")
	key, netns := f.pod("p")
	del := func() error {
		return f.m.Del(context.Background(), &request.Invocation{Verb: request.Del, Key: key})
	}
	if err := del(); err != nil {
		t.Fatalf("DEL of an unknown attachment: %v", err)
	}
	if _, err := f.m.Add(context.Background(), addInvocation(key, netns)); err != nil {
		t.Fatal(err)
	}
	// The veth went with the pod's namespace, the pin with a reboot of /run.
	f.node.mu.Lock()
	clear(f.node.veths)
	clear(f.node.pins)
	f.node.mu.Unlock()
	for i := range 3 {
		if err := del(); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	if left := f.leftovers(); len(left) > 0 {
		t.Fatalf("after DEL, %q remain", left)
	}
}

// CHECK names every problem it finds, not only the first.
func TestCheckReportsEveryProblem(t *testing.T) {
	f := newFixture(t, "10.1.0.0/30")
	key, netns := f.pod("p")
	if _, err := f.m.Add(context.Background(), addInvocation(key, netns)); err != nil {
		t.Fatal(err)
	}
	check := func(inv *request.Invocation) error { return f.m.Check(context.Background(), inv) }
	if err := check(addInvocation(key, netns)); err != nil {
		t.Fatalf("CHECK of a healthy attachment: %v", err)
	}
	ep, err := f.store.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	f.pool.Release(ep.IPs)
	f.node.mu.Lock()
	f.node.broken[ep.HostIfName] = errors.New("host route to 10.1.0.1 is missing")
	f.node.mu.Unlock()
	_, elsewhere := f.pod("elsewhere")
	err = check(addInvocation(key, elsewhere))
	for _, want := range []string{"CHECK names " + elsewhere, "not reserved in IPAM", "host route to 10.1.0.1 is missing"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CHECK = %v, does not say %q", err, want)
		}
	}

	// A chained attachment: the addresses and the host peer both differ.
	ckey := store.Key{Network: "net", ContainerID: "c", IfName: "eth0"}
	f.node.addPeer("/var/run/netns/c", "eth0", "veth-one", netip.MustParseAddr("10.9.0.5"))
	if _, err := f.m.Add(context.Background(), chainedInvocation(ckey, "/var/run/netns/c", true, "10.9.0.5/24")); err != nil {
		t.Fatal(err)
	}
	f.node.addPeer("/var/run/netns/c", "eth0", "veth-two")
	err = check(chainedInvocation(ckey, "/var/run/netns/c", true, "10.9.0.7/24"))
	for _, want := range []string{"10.9.0.5 of the attachment is missing", "prevResult has address 10.9.0.7", "peer of eth0 is veth-two"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("chained CHECK = %v, does not say %q", err, want)
		}
	}
	if err := check(addInvocation(store.Key{Network: "net", ContainerID: "never", IfName: "eth0"}, netns)); cniCode(err) != types.ErrUnknownContainer {
		t.Errorf("CHECK of an unknown attachment = %v, want code %d", err, types.ErrUnknownContainer)
	}
}

// GC removes, in its network, every attachment the valid list omits and
// every veth and pin no record names, and nothing else.
func TestGCRemovesWhatTheValidListOmits(t *testing.T) {
	f := newFixture(t, "10.1.0.0/28")
	var keys []store.Key
	for _, name := range []string{"keep", "stale-1", "stale-2"} {
		key, netns := f.pod(name)
		if _, err := f.m.Add(context.Background(), addInvocation(key, netns)); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	other, otherNS := f.pod("other-network")
	other.Network = "other"
	if _, err := f.m.Add(context.Background(), addInvocation(other, otherNS)); err != nil {
		t.Fatal(err)
	}
	// What a crash between kernel work and its record leaves.
	f.node.mu.Lock()
	f.node.veths["cdo000000000000"] = &fakeVeth{index: 999}
	f.node.pins[fixturePinDir+"/cdo111111111111"] = "/var/run/netns/gone"
	f.node.mu.Unlock()

	gc := addInvocation(store.Key{Network: "net"}, "")
	if err := f.m.GC(context.Background(), gc, []types.GCAttachment{{ContainerID: "keep", IfName: "eth0"}}); err != nil {
		t.Fatal(err)
	}
	mustBeAttached(t, f, keys[0])
	mustBeAttached(t, f, other)
	eps, err := f.store.List("")
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != 2 {
		t.Errorf("after GC %d records remain, want 2 (the valid one, the other network's)", len(eps))
	}
	var used int
	for _, u := range f.pool.Usage() {
		used += u.Used
	}
	f.node.mu.Lock()
	defer f.node.mu.Unlock()
	if used != 2 || len(f.node.veths) != 2 || len(f.node.pins) != 2 || len(f.node.attached) != 2 {
		t.Errorf("after GC: %d addresses, veths %v, pins %v, datapath endpoints %v; want two of each", used, f.node.veths, f.node.pins, f.node.attached)
	}
}

// At start the datapath is made to match the records: every stored
// endpoint is re-attached, with its veth's MACs, and an endpoint no record
// names is detached.
func TestReconcileDatapath(t *testing.T) {
	f := newFixture(t, "10.1.0.0/30")
	key, netns := f.pod("p")
	if _, err := f.m.Add(context.Background(), addInvocation(key, netns)); err != nil {
		t.Fatal(err)
	}
	f.node.mu.Lock()
	f.node.attached = map[string]dpapi.Endpoint{"net/crashed/eth0": {Key: "net/crashed/eth0", HostIfIndex: 7}}
	f.node.mu.Unlock()
	if err := f.m.ReconcileDatapath(); err != nil {
		t.Fatal(err)
	}
	f.node.mu.Lock()
	defer f.node.mu.Unlock()
	if _, ok := f.node.attached["net/crashed/eth0"]; ok || len(f.node.attached) != 1 {
		t.Fatalf("attached after reconcile: %v, want only %s", f.node.attached, key)
	}
	if ep := f.node.attached[key.String()]; ep.HostIfIndex == 0 || ep.HostMAC == nil || ep.PodMAC == nil {
		t.Errorf("re-attached %+v without its interface or MACs", ep)
	}
}

type ctxKey struct{}

// requestLabeler answers with the request's own context or not at all.
type requestLabeler struct{}

func (requestLabeler) PodLabels(ctx context.Context, namespace, name, uid string) (map[string]string, error) {
	if ctx.Value(ctxKey{}) == nil {
		return nil, errors.New("asked without the request's context")
	}
	return map[string]string{"app": name}, nil
}

// The pod's labels are looked up under the request's context (its deadline
// and trace), never a background one.
func TestAddAsksForLabelsUnderTheRequestContext(t *testing.T) {
	f := newFixture(t, "10.1.0.0/30")
	cfg := f.m.cfg
	cfg.PodLabels = requestLabeler{}
	m := New(cfg)
	key, netns := f.pod("p")
	inv := addInvocation(key, netns)
	inv.PodName = "web"
	if _, err := m.Add(context.WithValue(context.Background(), ctxKey{}, true), inv); err != nil {
		t.Fatal(err)
	}
	f.node.mu.Lock()
	defer f.node.mu.Unlock()
	if got := f.node.attached[key.String()].Labels["app"]; got != "web" {
		t.Errorf("attached with labels %v", f.node.attached[key.String()].Labels)
	}
}

// chainedRecorder is a ChainedNetworks that records what it holds.
type chainedRecorder struct {
	mu   sync.Mutex
	held map[string][]netip.Prefix
}

func (c *chainedRecorder) LearnChained(key string, networks []netip.Prefix) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held == nil {
		c.held = map[string][]netip.Prefix{}
	}
	c.held[key] = networks
}

func (c *chainedRecorder) ForgetChained(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.held, key)
}

func (c *chainedRecorder) get(key string) []netip.Prefix {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[key]
}

// The networks of a chained attachment's pod, with prevResult's lengths,
// are learnt before its ADD returns, recorded, learnt again from the store
// at Restore (a record from before they were kept gives its addresses),
// and forgotten when the attachment goes.
func TestChainedNetworksFollowAttachments(t *testing.T) {
	f := newFixture(t, "10.1.0.0/30")
	rec := &chainedRecorder{}
	f.m.cfg.Chained = rec
	k1 := store.Key{Network: "net", ContainerID: "c1", IfName: "eth0"}
	k2 := store.Key{Network: "net", ContainerID: "c2", IfName: "eth0"}
	f.node.addPeer("/var/run/netns/c1", "eth0", "veth-c1", netip.MustParseAddr("10.9.0.5"))
	f.node.addPeer("/var/run/netns/c2", "eth0", "veth-c2", netip.MustParseAddr("10.9.0.6"))
	for _, c := range []struct {
		key  store.Key
		addr string
	}{{k1, "10.9.0.5/24"}, {k2, "10.9.0.6/24"}} {
		if _, err := f.m.Add(context.Background(), chainedInvocation(c.key, "/var/run/netns/"+c.key.ContainerID, true, c.addr, "fd00:9::5/64")); err != nil {
			t.Fatal(err)
		}
		want := []netip.Prefix{netip.MustParsePrefix(c.addr), netip.MustParsePrefix("fd00:9::5/64")}
		if got := rec.get(c.key.String()); !slices.Equal(got, want) {
			t.Fatalf("%s: learnt %v at ADD, want %v", c.key, got, want)
		}
		ep, err := f.store.Get(c.key)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ep.Networks, want) {
			t.Fatalf("%s: record keeps networks %v, want %v", c.key, ep.Networks, want)
		}
	}
	if err := f.m.Del(context.Background(), addInvocation(k1, "/var/run/netns/c1")); err != nil {
		t.Fatal(err)
	}
	if got := rec.get(k1.String()); got != nil {
		t.Fatalf("%s still learnt after its DEL: %v", k1, got)
	}

	// A record written before networks were kept.
	old, err := f.store.Get(k2)
	if err != nil {
		t.Fatal(err)
	}
	old.Key.ContainerID, old.Networks = "c3", nil
	if err := f.store.Put(old); err != nil {
		t.Fatal(err)
	}
	restarted := &chainedRecorder{}
	m := New(Config{PinDir: fixturePinDir, Pool: f.pool, Store: f.store, Network: f.node, Datapath: f.node, Chained: restarted})
	if err := m.Restore(); err != nil {
		t.Fatal(err)
	}
	if got, want := restarted.get(k2.String()), []netip.Prefix{netip.MustParsePrefix("10.9.0.6/24"), netip.MustParsePrefix("fd00:9::5/64")}; !slices.Equal(got, want) {
		t.Errorf("Restore learnt %v for %s, want %v", got, k2, want)
	}
	if got, want := restarted.get(old.Key.String()), old.IPs; !slices.Equal(got, want) || len(want) == 0 {
		t.Errorf("Restore learnt %v for a record without networks, want its addresses %v", got, want)
	}
	if got := restarted.get(k1.String()); got != nil {
		t.Errorf("Restore learnt the deleted %s: %v", k1, got)
	}
}
