package routing

import (
	"errors"
	"net/netip"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// BlackholeProtocol marks the fail-closed routes of encrypted routing
// (rtm_protocol), apart from the device's (RouteProtocol) and BGP's, so a
// reconcile, turning encryption off and uninstall find them and only them.
const BlackholeProtocol = 0xc7

// BlackholeMetric ranks the fail-closed routes behind the device's in the
// same table: those carry the default metric (0 for IPv4, 1024 for IPv6),
// and the kernel uses the lowest metric whose next hop exists.
const BlackholeMetric = 0xc5c5

// SyncBlackholes makes the main table hold one blackhole route per block
// (BlackholeProtocol, BlackholeMetric), and no other route of that protocol.
//
// With encryption on, the device's routes carry the other nodes' pod blocks;
// they name the device's link, so the kernel deletes them when the link goes
// (the userspace device's process ended with the daemon's container). A
// blackhole behind each of them is what the lookup then finds instead of
// the node's default route, which would carry pod packets to other nodes in
// the clear. Blackhole rather than unreachable or prohibit: those answer
// pods with ICMP errors that fail new connections at once and surface as
// send errors on UDP sockets, while a silent drop is a loss TCP retransmits
// through once the device is back. The routes outlive the daemon on purpose.
func SyncBlackholes(blocks []netip.Prefix, log *zap.Logger) error {
	want := make([]netlink.Route, 0, len(blocks))
	for _, b := range blocks {
		want = append(want, netlink.Route{Dst: ipNet(b.Masked()), Type: unix.RTN_BLACKHOLE, Priority: BlackholeMetric})
	}
	return errors.Join(SyncProtocol(unix.RT_TABLE_MAIN, BlackholeProtocol, want, true, log)...)
}

// RemoveBlackholes deletes every route SyncBlackholes installed: encryption
// was turned off, or Coordino is being uninstalled.
func RemoveBlackholes(log *zap.Logger) error { return SyncBlackholes(nil, log) }
