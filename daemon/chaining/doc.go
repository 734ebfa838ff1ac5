// Package chaining finds, for an attachment made by another CNI plugin, the
// pod interface (by CNI_NETNS and CNI_IFNAME, whether or not prevResult
// names it), the addresses prevResult gives it, and the host-side peer
// Coordino attaches its datapath to.
package chaining
