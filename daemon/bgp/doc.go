// Package bgp is --routing=bgp: a BGP speaker in the daemon (GoBGP) that
// announces this node's pod blocks to the fabric's routers, IPv4 and IPv6
// through MP-BGP with the node's address of each family as next hop, and
// installs the routes the routers send for other nodes' blocks into the
// kernel with a route protocol of its own (RouteProtocol), so they are
// recognisable and a restart finds them.
//
// Safety: a learned route that overlaps this node's own blocks, covers one
// of its addresses or overlaps a Service range is never installed; each
// peer may send at most MaxPrefixes per family; the MD5 password is a
// Secret type that prints redacted.
//
// Graceful restart (RFC 4724): the speaker announces a restart time; a
// daemon that stops without a Cease (SIGKILL, SIGTERM for an upgrade)
// leaves its kernel routes and the peers keep its routes as stale. The
// next start sets the restart bit, keeps every route it had installed and
// only prunes them once each peer has sent its End-of-RIB (or the restart
// time has passed). No RFC 8538 N-bit is advertised, so a session a peer's
// hold timer ends (the node lost) is withdrawn at once, not kept stale; a
// node that is deleted leaves (Leave: a Cease on every session).
//
// Service addresses (ServiceRoutes): the LoadBalancer and external IPs of
// the Services a serviceSelector selects are announced as host routes, a
// Local Service's only from nodes with a ready endpoint of it.
//
// With WireGuard the speaker still announces the node's blocks, and the
// guard also refuses learned routes over the blocks the tunnel carries
// (Guard.Encrypted).
package bgp
