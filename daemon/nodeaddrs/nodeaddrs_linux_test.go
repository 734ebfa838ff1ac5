package nodeaddrs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/coordino/coordino/test/privileged"
)

// countDumps counts the address dumps of the package for the test.
func countDumps(t *testing.T) *atomic.Int32 {
	var n atomic.Int32
	orig := list
	list = func(open func(...int) (*netlink.Handle, error)) ([]ifAddr, error) {
		n.Add(1)
		return orig(open)
	}
	t.Cleanup(func() { list = orig })
	return &n
}

// recorder collects what Watch hands the datapath.
type recorder chan []netip.Addr

func (r recorder) set(ips []netip.Addr) error { r <- ips; return nil }

func (r recorder) expect(t *testing.T, want ...string) {
	t.Helper()
	var w []netip.Addr
	for _, s := range want {
		w = append(w, netip.MustParseAddr(s))
	}
	select {
	case got := <-r:
		if !slices.Equal(got, w) {
			t.Fatalf("node addresses %v, want %v", got, w)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("node addresses never became %v", w)
	}
}

func (r recorder) expectNothing(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case got := <-r:
		t.Fatalf("node addresses changed to %v, want no change", got)
	case <-time.After(d):
	}
}

func addAddr(t *testing.T, h *netlink.Handle, link netlink.Link, cidr string) *netlink.Addr {
	t.Helper()
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	a.Flags = 0x02 // IFA_F_NODAD: usable at once
	if err := h.AddrAdd(link, a); err != nil {
		t.Fatalf("add %s: %v", cidr, err)
	}
	return a
}

// addUplink adds a veth pair standing in for a node interface (the test
// kernel may lack the dummy driver) and returns its up end.
func addUplink(t *testing.T, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		t.Fatal(err)
	}
	link, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	return link
}

// TestWatchFollowsGlobalAddressesWithoutRelisting: global addresses added
// and removed reach the datapath; the link-local addresses of new veths
// (one per pod on a real node) change nothing and cost no listing of every
// address, as a watch that re-lists on each event would.
func TestWatchFollowsGlobalAddressesWithoutRelisting(t *testing.T) {
	ns, h := privileged.NewNetns(t)
	dumps := countDumps(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rec := make(recorder, 16)
	// The watch outlives the test by a moment: a test logger would panic.
	if err := Watch(ctx, ns, nil, rec.set, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	dummy := addUplink(t, h, "cdo-node0")
	v4 := addAddr(t, h, dummy, "198.51.100.7/24")
	rec.expect(t, "198.51.100.7")
	addAddr(t, h, dummy, "2001:db8::7/64")
	rec.expect(t, "198.51.100.7", "2001:db8::7")

	// Every veth brought up gets a link-local IPv6 address: events, but not
	// the node's addresses.
	events := make(chan netlink.AddrUpdate, 256)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.AddrSubscribeWithOptions(events, done, netlink.AddrSubscribeOptions{Namespace: &ns}); err != nil {
		t.Fatal(err)
	}
	before := dumps.Load()
	for i := range 10 {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("cdo-h%d", i)}, PeerName: fmt.Sprintf("cdo-p%d", i)}
		if err := h.LinkAdd(veth); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{veth.Name, veth.PeerName} {
			l, err := h.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
		}
	}
	linkLocal := 0
	for deadline := time.After(3 * time.Second); linkLocal < 20; {
		select {
		case u := <-events:
			if u.Scope == int(netlink.SCOPE_LINK) && u.NewAddr {
				linkLocal++
			}
		case <-deadline:
			t.Fatalf("saw %d link-local address events, want 20: the test proves nothing", linkLocal)
		}
	}
	rec.expectNothing(t, 500*time.Millisecond)
	if n := dumps.Load() - before; n != 0 {
		t.Errorf("%d address listings for %d link-local events, want 0", n, linkLocal)
	}

	if err := h.AddrDel(dummy, v4); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "2001:db8::7")
	if err := h.LinkDel(dummy); err != nil {
		t.Fatal(err)
	}
	rec.expect(t)
}

// TestWatchReopensAfterFailure: a watch whose socket failed (closed
// channel) is opened again and lists once more, so a change made while it
// was down still reaches the datapath.
func TestWatchReopensAfterFailure(t *testing.T) {
	ns, h := privileged.NewNetns(t)
	dumps := countDumps(t)
	ctx, cancel := context.WithCancel(context.Background())
	exited := make(chan struct{})
	t.Cleanup(func() { cancel(); <-exited })
	rec := make(recorder, 16)
	w := &watch{ns: ns, set: rec.set, log: zaptest.NewLogger(t), have: map[ifAddr]struct{}{}}
	failed := subscription{updates: make(chan netlink.AddrUpdate), done: make(chan struct{}), closed: new(atomic.Bool)}
	close(failed.updates)
	dummy := addUplink(t, h, "cdo-node1")
	addAddr(t, h, dummy, "203.0.113.9/24")
	go func() { w.run(ctx, failed); close(exited) }()
	rec.expect(t, "203.0.113.9")
	if dumps.Load() != 1 {
		t.Errorf("%d listings, want 1 (the re-opened watch's)", dumps.Load())
	}
	// And it follows events again.
	addAddr(t, h, dummy, "203.0.113.10/24")
	rec.expect(t, "203.0.113.9", "203.0.113.10")
}
