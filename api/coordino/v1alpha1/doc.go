// Package v1alpha1 holds the coordino.io/v1alpha1 API types: IPPool,
// NodeConfig, IPBlock, Identity, PolicyIR and NodeIsolationPolicy, plus the
// small pure helpers both the daemon and the controller need to read them
// the same way (CIDR parsing, block names, identity label sets and hashes).
//
// +kubebuilder:object:generate=true
// +groupName=coordino.io
package v1alpha1
