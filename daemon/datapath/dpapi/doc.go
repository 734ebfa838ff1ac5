// Package dpapi is what the endpoint manager and every datapath share: the
// description of a pod interface to enforce policy on, and the error that
// says a datapath is at capacity. It imports neither side, so the eBPF
// datapath, a second datapath (nftables) and daemon/endpoint all depend on
// it and not on each other.
package dpapi
