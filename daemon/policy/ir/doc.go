// Package ir is the first stage of Coordino's policy pipeline: it validates
// networking.k8s.io/v1 NetworkPolicy and normalizes it into a selector-based
// intermediate representation (Policy): who a policy selects, which
// directions it isolates, and per rule the peers (label selectors or CIDR
// blocks) and protocol/port ranges it allows. Nothing here knows identities,
// nodes or BPF: the package depends only on the Kubernetes API types,
// apimachinery and net/netip, so the controller can produce the same IR
// (PolicyIR) that the daemon's incremental matcher consumes.
package ir
