// Package inspect is the daemon's read-only inspection service
// (coordino.inspect.v1.Inspector) for coordinoctl: status with a verdict,
// endpoints, identities, IPAM, policy explanations computed from the BPF
// maps the datapath enforces, recent drops and bug-report files. It is
// served on its own root-only, peer-checked socket and has no method that
// changes state.
package inspect
