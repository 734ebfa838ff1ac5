// Package policyir is the first stage of Coordino's policy pipeline: it validates
// networking.k8s.io/v1 NetworkPolicy and normalizes it into a selector-based
// intermediate representation (Policy): who a policy selects, which
// directions it isolates, and per rule the peers (label selectors or CIDR
// blocks) and protocol/port ranges it allows. Nothing here knows identities,
// nodes or BPF: the package depends only on the Kubernetes API types,
// apimachinery, net/netip and the PolicyIR API type: Compile turns a
// NetworkPolicy into the PolicyIR spec the controller publishes, FromSpec
// turns that spec into the Policy the daemon's incremental engine consumes,
// and Normalize (both in a row) serves standalone mode.
package policyir
