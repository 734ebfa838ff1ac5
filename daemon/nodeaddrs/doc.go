// Package nodeaddrs knows the node's own addresses (global scope, on any
// interface): traffic from them is the host identity, so kubelet probes stay
// allowed. It lists them once and then follows the kernel's address events
// one by one, so the cost of a change does not grow with the number of
// interfaces (every pod's host veth has addresses of its own).
package nodeaddrs
