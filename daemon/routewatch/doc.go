// Package routewatch tells when a network namespace's forwarding may have
// changed: a route, a routing rule, a nexthop object or a link. Host
// routing's programs remember the FIB's answers per flow
// (bpf/lib/hostroute.h); the daemon empties that cache on every such change,
// so a packet never follows a route the kernel no longer has for longer than
// the daemon takes to read one notification.
package routewatch
