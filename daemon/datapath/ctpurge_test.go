package datapath

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/vishvananda/netlink"
)

// Conntrack entries these tests plant, a real table in the kernel.
var (
	otherPeer = netip.MustParseAddr("192.0.2.77")
	// deadIfindex stands for an endpoint removed without a pending record
	// (an older version, or a crash before the DEL recorded it).
	deadIfindex = uint32(1<<31 - 7)
)

// ctKey is a TCP flow seen on ifindex from src to dst.
func ctKey(ifindex uint32, src, dst netip.Addr, port uint16) bpf.CoordinoCtKey {
	k := bpf.CoordinoCtKey{Ifindex: ifindex, Proto: 6, Sport: 40000 + port, Dport: port}
	k.Family, k.Src = packetAddr(src)
	_, k.Dst = packetAddr(dst)
	return k
}

// plantFlows writes flows of the endpoint ep (on its interface, and on
// peer's naming ep's address both ways) and one flow of peer that names
// neither; it returns the flows that must go and the one that must stay.
func plantFlows(t *testing.T, d *Datapath, ep, peer Endpoint) (gone []bpf.CoordinoCtKey, kept bpf.CoordinoCtKey) {
	t.Helper()
	own, peerIf := uint32(ep.HostIfIndex), uint32(peer.HostIfIndex)
	gone = []bpf.CoordinoCtKey{
		ctKey(own, ep.IPs[0], otherPeer, 80),
		ctKey(peerIf, peer.IPs[0], ep.IPs[0], 81),
		ctKey(peerIf, ep.IPs[0], peer.IPs[0], 82),
	}
	kept = ctKey(peerIf, peer.IPs[0], otherPeer, 83)
	v := bpf.CoordinoCtEntry{LastSeenNs: uint64(time.Now().UnixNano()), Flags: ctRevokedFlag}
	for _, k := range append(gone, kept) {
		if err := d.objs.CdoConntrack.Update(&k, &v, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	return gone, kept
}

// ctRevokedFlag is CT_REVOKED: a tombstone, the entry a new pod must
// least inherit (its first connections on the tuple would be dropped).
const ctRevokedFlag = 4

// present returns the keys still in the table.
func present(t *testing.T, d *Datapath, keys ...bpf.CoordinoCtKey) []bpf.CoordinoCtKey {
	t.Helper()
	var out []bpf.CoordinoCtKey
	var v bpf.CoordinoCtEntry
	for i := range keys {
		err := d.objs.CdoConntrack.Lookup(&keys[i], &v)
		switch {
		case err == nil:
			out = append(out, keys[i])
		case !errors.Is(err, ebpf.ErrKeyNotExist):
			t.Fatal(err)
		}
	}
	return out
}

func pinnedPurges(t *testing.T, d *Datapath) int {
	t.Helper()
	n := 0
	var k purgeKey
	var v uint8
	it := d.ct.purger.m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitPurged waits for the background walk to serve every pending purge.
func waitPurged(t *testing.T, d *Datapath) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for d.ct.purger.pendingEndpoints() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d removed endpoints still pending a conntrack purge after 10s", d.ct.purger.pendingEndpoints())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDetachDoesNotWalkConntrack: DEL reads no part of the conntrack
// table; the removed endpoint's flows are left pending (and recorded).
func TestDetachDoesNotWalkConntrack(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, purgeInterval: time.Hour}, false)
	gone, _ := plantFlows(t, c.dp, c.eps["b"], c.eps["a"])
	walks := c.dp.ct.walks.Load()
	if err := c.dp.DetachEndpoint(c.eps["b"]); err != nil {
		t.Fatal(err)
	}
	if n := c.dp.ct.walks.Load() - walks; n != 0 {
		t.Fatalf("DEL read the whole conntrack table %d times", n)
	}
	if !c.dp.ct.purger.isPending(uint32(c.eps["b"].HostIfIndex), c.eps["b"].IPs) {
		t.Fatal("the removed endpoint's flows are not pending a purge")
	}
	if n := pinnedPurges(t, c.dp); n != 2 {
		t.Fatalf("%d pending purges pinned, want 2 (interface and address)", n)
	}
	if n := len(present(t, c.dp, gone...)); n != len(gone) {
		t.Fatalf("%d of %d flows left before the background walk", n, len(gone))
	}
}

// TestAttachReusingPendingPurgesFirst: a new endpoint given the address or
// the interface of a removed one whose purge is still pending finds none
// of its flows when AttachEndpoint returns, before its first packet.
func TestAttachReusingPendingPurgesFirst(t *testing.T) {
	for _, reuse := range []string{"address", "interface"} {
		t.Run(reuse, func(t *testing.T) {
			c := newClusterWith(t, Config{AttachMode: AttachTC, purgeInterval: time.Hour}, false)
			old := c.eps["b"]
			gone, kept := plantFlows(t, c.dp, old, c.eps["a"])
			if err := c.dp.DetachEndpoint(old); err != nil {
				t.Fatal(err)
			}
			if n := len(present(t, c.dp, gone...)); n != len(gone) {
				t.Fatalf("purge not pending: %d of %d flows left", n, len(gone))
			}
			ep := Endpoint{Key: "net/new-" + reuse + "/eth0", Namespace: "default", Labels: map[string]string{"app": "server"}}
			switch reuse {
			case "address": // as DEL does: the veth goes, a new pod gets the address
				l, err := netlink.LinkByIndex(old.HostIfIndex)
				if err != nil {
					t.Fatal(err)
				}
				if err := netlink.LinkDel(l); err != nil {
					t.Fatal(err)
				}
				p := testnet.NewPod(t, "b2", old.IPs[0])
				ep.HostIfName, ep.HostIfIndex, ep.IPs = p.HostIfName, p.HostIfIndex, p.IPs
			case "interface":
				ep.HostIfName, ep.HostIfIndex, ep.IPs = old.HostIfName, old.HostIfIndex, []netip.Addr{podIPs["d"]}
			}
			if err := c.dp.AttachEndpoint(ep); err != nil {
				t.Fatal(err)
			}
			if left := present(t, c.dp, gone...); len(left) > 0 {
				t.Fatalf("new endpoint attached with %d flows of the removed one: %+v", len(left), left)
			}
			if len(present(t, c.dp, kept)) != 1 {
				t.Fatal("a flow naming neither the interface nor the address was purged")
			}
			if c.dp.ct.purger.pendingEndpoints() != 0 || pinnedPurges(t, c.dp) != 0 {
				t.Fatal("purge done but still pending")
			}
		})
	}
}

// TestPendingPurgeCompletes: the background walk removes the flows of
// every removed endpoint, one walk for several DELs, and clears the pins.
func TestPendingPurgeCompletes(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, purgeInterval: 300 * time.Millisecond}, false)
	goneB, kept := plantFlows(t, c.dp, c.eps["b"], c.eps["a"])
	goneC, _ := plantFlows(t, c.dp, c.eps["c"], c.eps["a"])
	walks := c.dp.ct.walks.Load()
	for _, name := range []string{"b", "c"} {
		if err := c.dp.DetachEndpoint(c.eps[name]); err != nil {
			t.Fatal(err)
		}
	}
	waitPurged(t, c.dp)
	if left := present(t, c.dp, append(goneB, goneC...)...); len(left) > 0 {
		t.Fatalf("%d flows of removed endpoints left after the purge: %+v", len(left), left)
	}
	if len(present(t, c.dp, kept)) != 1 {
		t.Fatal("a flow of a live endpoint was purged")
	}
	if n := pinnedPurges(t, c.dp); n != 0 {
		t.Fatalf("%d pending purges still pinned", n)
	}
	if n := c.dp.ct.walks.Load() - walks; n > 2 {
		t.Errorf("%d walks for two DELs a moment apart, want them coalesced", n)
	}
}

// TestPendingPurgeSurvivesRestart: purges pending when the daemon stops
// (or crashes) are done by the next Open before it returns, and so are
// flows on interfaces no endpoint has; live endpoints keep theirs.
func TestPendingPurgeSurvivesRestart(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, purgeInterval: time.Hour}, false)
	gone, kept := plantFlows(t, c.dp, c.eps["b"], c.eps["a"])
	dead := ctKey(deadIfindex, otherPeer, netip.MustParseAddr("192.0.2.78"), 84)
	node := ctKey(0, testnet.NodeIP, otherPeer, 85) // node flows: ifindex 0
	for _, k := range []bpf.CoordinoCtKey{dead, node} {
		v := bpf.CoordinoCtEntry{LastSeenNs: uint64(time.Now().UnixNano())}
		if err := c.dp.objs.CdoConntrack.Update(&k, &v, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.dp.DetachEndpoint(c.eps["b"]); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.Close(); err != nil {
		t.Fatal(err)
	}
	c.open()
	if left := present(t, c.dp, append(gone, dead)...); len(left) > 0 {
		t.Fatalf("%d flows of removed endpoints left after restart: %+v", len(left), left)
	}
	if len(present(t, c.dp, kept, node)) != 2 {
		t.Fatal("restart purged a flow of a live endpoint or of the node")
	}
	if c.dp.ct.purger.pendingEndpoints() != 0 || pinnedPurges(t, c.dp) != 0 {
		t.Fatal("purged at start but still pending")
	}
}

// TestDetachPurgesNowWhenPendingMapFull: a DEL that cannot record its
// pending purge does the walk itself, so nothing is left unowned.
func TestDetachPurgesNowWhenPendingMapFull(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, purgeInterval: time.Hour}, false)
	gone, kept := plantFlows(t, c.dp, c.eps["b"], c.eps["a"])
	keys := make([]purgeKey, maxPendingPurges)
	for i := range keys {
		keys[i] = purgeKey{Addr: [16]byte{0xfd, 0, byte(i >> 16), byte(i >> 8), byte(i)}}
	}
	if _, err := c.dp.ct.purger.m.BatchUpdate(keys, make([]uint8, len(keys)), nil); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.DetachEndpoint(c.eps["b"]); err != nil {
		t.Fatal(err)
	}
	if left := present(t, c.dp, gone...); len(left) > 0 {
		t.Fatalf("pending map full: %d flows of the removed endpoint left", len(left))
	}
	if len(present(t, c.dp, kept)) != 1 {
		t.Fatal("a flow of a live endpoint was purged")
	}
}

// The pending purges are a map like the others to operators: coordinoctl
// maps, coordino_bpf_map_entries and the map-pressure alert see it.
func TestMapUsageCountsPendingPurges(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, purgeInterval: time.Hour}, false)
	if err := c.dp.DetachEndpoint(c.eps["b"]); err != nil {
		t.Fatal(err)
	}
	us, err := c.dp.MapUsage()
	if err != nil {
		t.Fatal(err)
	}
	want := pinnedPurges(t, c.dp)
	for _, u := range us {
		if u.Name == ctPurgeMapName {
			if want == 0 || u.Entries != want || u.Capacity != maxPendingPurges {
				t.Fatalf("%s: %d/%d entries, %d pinned", u.Name, u.Entries, u.Capacity, want)
			}
			return
		}
	}
	t.Fatalf("MapUsage lists no %s", ctPurgeMapName)
}
