package endpoint

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/proto/cni/v1/wire"
	"github.com/coordino/coordino/proto/deletequeue"
)

func storedEndpoint(t *testing.T, st *store.Store, containerID, ip string) *store.Endpoint {
	t.Helper()
	k := store.Key{Network: "restore-test", ContainerID: containerID, IfName: "eth0"}
	ep := &store.Endpoint{
		Key: k, Mode: store.ModePrimary, Netns: "/proc/self/ns/net",
		// No such veth exists: release finds nothing to tear down.
		HostIfName: netsetup.HostIfName(k.Network, k.ContainerID, k.IfName),
		IPs:        []netip.Prefix{netip.MustParsePrefix(ip)},
		Created:    time.Now().Add(-time.Hour),
	}
	if err := st.Put(ep); err != nil {
		t.Fatal(err)
	}
	return ep
}

// After the node's block changed, a stored address may be the new block's
// network address or collide with another endpoint's. Restore used to fail
// (the daemon exited at start-up, forever), so queued DELs never drained.
func TestRestoreSurvivesAddressesTheNewBlockCannotReserve(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Keys sort a-, b-, c-: the holder is restored before the duplicate.
	network := storedEndpoint(t, st, "a-network-address", "10.6.0.4/32")
	holder := storedEndpoint(t, st, "b-holder", "10.6.0.5/32")
	dup := storedEndpoint(t, st, "c-duplicate", "10.6.0.5/32")
	pool, err := ipam.NewPool([]netip.Prefix{netip.MustParsePrefix("10.6.0.4/30")})
	if err != nil {
		t.Fatal(err)
	}
	m := New(Config{Pool: pool, Store: st, Network: newFakeNode()})
	if err := m.Restore(); err != nil {
		t.Fatalf("Restore failed, the daemon would crash-loop: %v", err)
	}
	if got := testutil.ToFloat64(m.Collectors()[0]); got != 2 {
		t.Fatalf("coordino_endpoints_unrestorable = %v, want 2", got)
	}

	// A DEL the plugin queued while the daemon was down drains.
	queue := filepath.Join(t.TempDir(), "queue")
	conf := `{"cniVersion":"1.1.0","name":"restore-test","type":"coordino"}`
	if err := deletequeue.Write(queue, &wire.Request{ContainerID: network.ContainerID, IfName: "eth0", Stdin: []byte(conf)}); err != nil {
		t.Fatal(err)
	}
	if n, err := m.DrainDeleteQueue(context.Background(), queue); err != nil || n != 1 {
		t.Fatalf("DrainDeleteQueue = %d, %v", n, err)
	}
	if _, err := st.Get(network.Key); err == nil {
		t.Fatal("queued DEL did not remove the endpoint")
	}

	// DEL of the duplicate must not free the address its holder uses.
	if err := m.del(context.Background(), dup.Key, nil); err != nil {
		t.Fatal(err)
	}
	if !pool.InUse(netip.MustParseAddr("10.6.0.5")) {
		t.Fatal("DEL of an unrestorable endpoint freed an address another endpoint holds")
	}
	if got := testutil.ToFloat64(m.Collectors()[0]); got != 0 {
		t.Fatalf("coordino_endpoints_unrestorable = %v after DELs, want 0", got)
	}
	if err := m.del(context.Background(), holder.Key, nil); err != nil {
		t.Fatal(err)
	}
	if pool.InUse(netip.MustParseAddr("10.6.0.5")) {
		t.Fatal("DEL of the holder did not free its address")
	}
	// The freed address serves new pods; the network address never does.
	for range 3 {
		a, err := pool.Allocate()
		if err != nil {
			break
		}
		if strings.HasSuffix(a[0].Addr().String(), ".4") {
			t.Fatalf("handed out the block's network address %v", a[0])
		}
	}
}
