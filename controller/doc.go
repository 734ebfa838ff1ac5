// Package controller is coordino-controller: the leader-elected cluster
// half of Coordino. It hands out pod address blocks from IPPools (or copies
// Node.spec.podCIDRs) into one NodeConfig per Node, reclaims them when nodes
// shrink or go away, and gives every distinct security label set of pods a
// cluster-wide numeric Identity. It also compiles every NetworkPolicy into
// a PolicyIR of the same namespace and name (policyir.go).
//
// The API server is the only lock. A block belongs to a node when the
// IPBlock named after it (create-if-absent) says so; the NodeConfig is the
// node's view of its IPBlocks. An Identity's name is its number, so two
// label sets never share a number even while two controllers overlap across
// a leader change.
//
// Allocation state is kept in memory indexes built from the informers and
// updated on every write (blocks by prefix and by node, identities by label
// set hash, pod counts per node), so the cost of an event is proportional to
// what it changes, not to the cluster size.
package controller
