// Package k8s is the daemon's Kubernetes control-plane source: informers on
// the node's own NodeConfig (its address blocks), the Pods of this node
// (their labels, read at ADD, and their named container ports, which
// resolve named-port rules), Namespaces, Identities and the PolicyIRs the
// controller compiles from NetworkPolicies.
//
// Nothing on the ADD path waits on the API server beyond a short, bounded
// wait for a pod the informer has not delivered yet, and nothing on it
// writes to the API: the daemon writes only its NodeConfig's status (block
// usage, node addresses, WireGuard public key) and its own NodeEndpoints,
// batched and rate-limited, from background loops.
//
// What the daemon last saw is persisted in the state directory, so a
// daemon restarted while the API server is unreachable restores its blocks,
// pod labels, identities and policy from it instead of flushing anything,
// and converges when the API server is back. The source reads the cluster
// through one view, that state until the informers sync and their listers
// after; what it feeds is one Sink, the datapath (Discard without one).
//
// Remote pods: every node's NodeEndpoints (other nodes' pod addresses with
// their cluster identity) reach the datapath's ipcache as deltas.
package k8s
