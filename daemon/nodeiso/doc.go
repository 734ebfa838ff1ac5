// Package nodeiso compiles NodeIsolationPolicy objects into what the eBPF
// datapath enforces: which directions are isolated (pod -> node addresses,
// node -> node) and the allowed (scope, protocol, port) entries, expanded
// into policy-map keys. It also validates a policy with errors that name
// the field, for the standalone policy directory.
package nodeiso
