package daemon

import (
	"net/netip"
	"testing"

	"github.com/coordino/coordino/daemon/peers"
)

// The status lists the other nodes as last applied, with what keeps one
// unreachable; this node is not its own peer.
func TestCrossNodeStatusListsAppliedPeers(t *testing.T) {
	c := &crossNodeStatus{self: "a", routing: "vxlan", encryption: "none"}
	c.setApplied(peers.Set{
		"a": {Name: "a", Addresses: []netip.Addr{netip.MustParseAddr("192.168.0.1")}},
		"b": {Name: "b", Addresses: []netip.Addr{netip.MustParseAddr("192.168.0.2")}, Blocks: []netip.Prefix{netip.MustParsePrefix("10.1.1.0/24")}},
		"c": {Name: "c"},
	})
	got := c.status("")
	if got.Routing != "vxlan" || got.Encryption != "none" || len(got.Peers) != 2 {
		t.Fatalf("status = %v", got)
	}
	b, cc := got.Peers[0], got.Peers[1]
	if b.Name != "b" || b.Addresses[0] != "192.168.0.2" || b.Blocks[0] != "10.1.1.0/24" || b.Problem != "" {
		t.Fatalf("peer b = %v", b)
	}
	if cc.Name != "c" || cc.Problem == "" {
		t.Fatalf("peer c without an address = %v", cc)
	}
}
