// Package routing makes this node reach the pod blocks of its peers: in
// direct mode a kernel route per peer block via the peer's node address, in
// vxlan mode through a kernel VXLAN device whose FDB and neighbour entries
// are programmed from the peer set (no learning, no multicast), and through
// a named device (the WireGuard interface) when encryption is on. Everything
// it programs carries its own route protocol or lives on its own device, so
// a reconcile at start-up removes what a previous run left behind.
package routing
