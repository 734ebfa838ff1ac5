// Package policy compiles Kubernetes networking.k8s.io/v1 NetworkPolicy into
// the identity-keyed rules Coordino's datapath enforces.
//
// Compilation is a pipeline of small stages: validate each object, collect
// the ipBlock prefixes (each becomes a CIDR identity), select the local
// identities each policy applies to (which isolates them per direction), resolve
// peers to remote identities, and turn ports into protocol/port ranges. The
// result expands into keys of the BPF policy LPM trie: a port range becomes
// the few port prefixes covering it, so a packet costs the same handful of
// lookups whatever the number of rules.
package policy
