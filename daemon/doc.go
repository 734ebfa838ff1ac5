// Package daemon is the Coordino node daemon: it serves the CNI plugin's
// verbs over gRPC and owns everything a pod attachment is made of on the node
// (addresses, netns pins, veths and routes, eBPF state, the endpoint store).
// Subpackages each own one part; Run in this package wires them together.
package daemon
