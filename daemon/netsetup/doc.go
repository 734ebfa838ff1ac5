// Package netsetup wires a pod into the node's network in primary mode: an
// L3-routed veth pair (no bridge) whose pod side gets the pod's /32 and /128
// addresses and a default route via a link-local gateway with a static
// neighbour entry, and whose host side gets a host route and a static
// neighbour entry per pod address. The host side is always the calling
// thread's current network namespace. It also switches on the node's
// forwarding without costing it its IPv6 router advertisements.
package netsetup
