// Package peers describes the other nodes of the cluster as the routing and
// WireGuard layers need them (underlay addresses, pod blocks, WireGuard key
// and endpoint) and feeds that set from a source: a peers file in standalone
// mode, NodeConfig objects in Kubernetes mode. Consumers only ever see the
// complete current set, so every source is a list-then-replace feed.
package peers
