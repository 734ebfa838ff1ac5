// Package nftdp is Coordino's second datapath: the same NetworkPolicy as
// the eBPF datapath (daemon/datapath), enforced with nftables where the
// kernel refuses the BPF programs or the operator forbids BPF
// (--datapath=nftables, or auto's fallback).
//
// It consumes the policy engine's output exactly as the eBPF map writer
// does and renders it as set elements of one table, inet coordino-policy:
//
//   - ipcache4/6 map a pod or node address to its identity, cidr4/6 map
//     address ranges to the CIDR identity of the longest ipBlock prefix
//     holding them (a prefix minus the prefixes in use inside it);
//   - allow-in and allow-out hold (local, remote, protocol range, port
//     range) for every rule, the port ranges of one identity pair and
//     protocol merged, so a packet costs a few set lookups whatever the
//     number of rules;
//   - each endpoint has an ingress and an egress chain, reached from the
//     forward (and, for pod to node, input) hook through the verdict maps
//     eps-in and eps-out keyed by its host interface. Its chain checks the
//     source (src4/6), lets replies and related packets of tracked
//     connections through, and asks the allow sets with its identity.
//
// A policy delta is one nftables transaction of element adds and removes
// (and the rewrite of the few endpoint chains whose identity or isolation
// changed): the kernel applies all of it or none, so a failed update leaves
// the previous policy in force. A detach only makes its endpoint's chains
// drop; its entries, and chains and sets no longer referenced, are deleted
// later, many in one transaction (sweep_linux.go). Attaches that arrive while a transaction
// is in the kernel share the next one (group commit, commit_linux.go). A
// restarted daemon adopts the table it finds and replaces its content by
// difference at the first snapshot.
//
// Drops, and allowed new flows while someone wants them, are logged to
// NFLOG group FlowLogGroup within per-endpoint and per-node limits and read
// back over netlink into the eBPF datapath's flow events (flows_linux.go).
// Explain decides from what the table was rendered from and names rules
// with policy.Explainer (explain_linux.go). The table carries a schema
// stamp (schema_linux.go): a newer layout this build cannot read is
// refused and left in force. NodeIsolationPolicy is enforced in chains of
// its own before the pods' (nodeiso_linux.go).
package nftdp
