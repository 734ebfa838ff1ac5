// Package multinode is the multi-node test bed: three node network
// namespaces joined by an underlay bridge in a namespace of its own, each
// running a coordino-daemon fed by a peers file, with pods on every node.
// The tests prove cross-node reachability per routing/encryption mode and
// family, MTU, peers joining and leaving, daemon crashes under traffic and,
// for WireGuard, that the underlay only ever carries the tunnel's UDP.
package multinode
