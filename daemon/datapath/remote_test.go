package datapath

import (
	"net/netip"
	"testing"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// Remote pod addresses reach the ipcache with their identity and leave it
// again; a local endpoint's address is never taken over by a remote claim.
func TestRemoteAddressesInIPCache(t *testing.T) {
	c := newCluster(t, AttachTC)
	lookup := func(a netip.Addr) (identity.ID, bool) {
		var v bpf.CoordinoIpcacheValue
		k := ipcacheKey(netip.PrefixFrom(a, a.BitLen()))
		if err := c.dp.objs.CdoIpcache.Lookup(&k, &v); err != nil {
			return 0, false
		}
		return identity.ID(v.Identity), true
	}
	remotePod, remotePod6 := netip.MustParseAddr("10.99.0.5"), netip.MustParseAddr("fd00:99::5")
	local := podIPs["a"]
	localID, _ := lookup(local)
	if err := c.dp.UpdateRemoteEndpoints(map[netip.Addr]identity.ID{remotePod: 300, remotePod6: 300, local: 301}, nil); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{remotePod, remotePod6} {
		if id, ok := lookup(a); !ok || id != 300 {
			t.Errorf("remote pod %v in the ipcache as %v (present %v), want 300", a, id, ok)
		}
	}
	if id, _ := lookup(local); id != localID {
		t.Errorf("local pod %v moved to %v by a remote claim, want its own %v", local, id, localID)
	}
	if err := c.dp.UpdateRemoteEndpoints(map[netip.Addr]identity.ID{remotePod6: 302}, []netip.Addr{remotePod}); err != nil {
		t.Fatal(err)
	}
	if id, ok := lookup(remotePod); ok {
		t.Errorf("removed remote pod %v still in the ipcache as %v", remotePod, id)
	}
	if id, _ := lookup(remotePod6); id != 302 {
		t.Errorf("remote pod %v is %v after its identity changed, want 302", remotePod6, id)
	}
	if err := c.dp.UpdateRemoteEndpoints(map[netip.Addr]identity.ID{remotePod: identity.FirstNodeLocal}, nil); err == nil {
		t.Error("a node-local identity was accepted for a remote pod")
	}
	if n := c.dp.RemoteEndpoints(); n != 2 {
		t.Errorf("%d remote endpoints known, want 2 (the local claim counts, it is only shadowed)", n)
	}
}

// TestRemoteAddressFollowsIPBlocks: a remote pod's ipcache entry carries the
// CIDR identity of the longest ipBlock prefix holding it, also when that
// prefix arrives after the address, so ipBlock rules keep matching remote
// pods as they match local ones (the upstream Netpol ipBlock cases).
func TestRemoteAddressFollowsIPBlocks(t *testing.T) {
	c := newCluster(t, AttachTC)
	remotePod := netip.MustParseAddr("203.0.113.77")
	if err := c.dp.UpdateRemoteEndpoints(map[netip.Addr]identity.ID{remotePod: 300}, nil); err != nil {
		t.Fatal(err)
	}
	c.policies(clientToExt)
	var v bpf.CoordinoIpcacheValue
	k := ipcacheKey(netip.PrefixFrom(remotePod, remotePod.BitLen()))
	if err := c.dp.objs.CdoIpcache.Lookup(&k, &v); err != nil {
		t.Fatal(err)
	}
	c.dp.mu.Lock()
	want := c.dp.engine.CIDRIdentity(remotePod)
	c.dp.mu.Unlock()
	if want == identity.World {
		t.Fatal("the ipBlock prefix has no CIDR identity")
	}
	if identity.ID(v.Identity) != 300 || identity.ID(v.CidrIdentity) != want {
		t.Fatalf("remote pod entry {identity %d, cidr %d}, want {300, %d}", v.Identity, v.CidrIdentity, want)
	}
}

// TestRemoteAddressesSurviveRestart: a reopened datapath keeps the remote
// pod entries a previous run left in the pinned ipcache, through its first
// flush, until the remote source says its view is complete; then those it
// confirmed stay and the others leave. Local endpoints are never taken for
// remote ones. Without the restore, the first flush deleted them all.
func TestRemoteAddressesSurviveRestart(t *testing.T) {
	c := newCluster(t, AttachTC)
	kept, gone := netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("2001:db8:99::7")
	if err := c.dp.UpdateRemoteEndpoints(map[netip.Addr]identity.ID{kept: 300, gone: 301}, nil); err != nil {
		t.Fatal(err)
	}
	lookup := func(a netip.Addr) identity.ID {
		var v bpf.CoordinoIpcacheValue
		k := ipcacheKey(netip.PrefixFrom(a, a.BitLen()))
		if err := c.dp.objs.CdoIpcache.Lookup(&k, &v); err != nil {
			return 0
		}
		return identity.ID(v.Identity)
	}
	if err := c.dp.Close(); err != nil {
		t.Fatal(err)
	}
	c.open()
	if n := c.dp.RemoteEndpoints(); n != 2 {
		t.Fatalf("%d remote endpoints restored, want 2 (local pods must not count)", n)
	}
	if err := c.dp.UpdatePolicy(policy.Snapshot{}); err != nil { // the first flush
		t.Fatal(err)
	}
	if lookup(kept) != 300 || lookup(gone) != 301 {
		t.Fatalf("after the restart's first flush: %v is %v, %v is %v; want 300 and 301", kept, lookup(kept), gone, lookup(gone))
	}
	if err := c.dp.UpdateRemoteEndpoints(map[netip.Addr]identity.ID{kept: 300}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.RemoteEndpointsSynced(); err != nil {
		t.Fatal(err)
	}
	if lookup(kept) != 300 || lookup(gone) != 0 {
		t.Fatalf("after the remote view synced: %v is %v, %v is %v; want 300 and gone", kept, lookup(kept), gone, lookup(gone))
	}
	if id := lookup(podIPs["b"]); id < identity.FirstPod {
		t.Fatalf("local pod b lost its ipcache entry (%v)", id)
	}
}
