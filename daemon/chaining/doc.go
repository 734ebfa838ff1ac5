// Package chaining finds, for an attachment made by another CNI plugin, the
// pod interface that plugin reported in prevResult and the host-side peer
// Coordino attaches its datapath to.
package chaining
