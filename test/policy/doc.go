// Package policy is the NetworkPolicy end-to-end suite: a node running
// coordino-daemon with --policy-dir, nine pods (a, b, c in namespaces x, y
// and z) attached through the CNI plugin, and for each policy case a full
// TCP/UDP reachability matrix on ports 80 and 81 compared with a truth
// table written from the Kubernetes NetworkPolicy documentation. It runs in
// primary mode (clsact + cls_bpf, the default), primary mode with
// --attach-mode=tcx, and chained after
// bridge + host-local, and also covers a daemon restart under traffic, a
// policy update under traffic, a pod denied from its first packet and a
// revoked UDP flow that stays revoked on its own ports. A
// dual-stack mode (IPv4 and IPv6 pod CIDRs) runs a subset, plus
// family-specific ipBlock cases, over both families at once, and the
// first-packet check over IPv6. In Kubernetes mode (a real kube-apiserver,
// the controller's policy compiler) the whole matrix runs with every case's
// NetworkPolicies created through the API and enforced from the PolicyIRs.
// The tests that build a node are privileged (network namespaces, BPF).
package policy
