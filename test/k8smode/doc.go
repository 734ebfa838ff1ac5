// Package k8smode tests the daemon in Kubernetes mode against a real
// kube-apiserver and etcd (test/apiserver) with netns nodes and pods
// (test/harness) driven through libcni, with the controller's real policy
// compiler in-process turning NetworkPolicies into the PolicyIRs the daemon
// enforces: pod labels from Pod objects, blocks
// from NodeConfig, named ports from the Pods' container ports, temporary →
// cluster identities under traffic, and the
// outage behaviour (controller down, API server unreachable, daemon
// restarted while it is, convergence on reconnect).
package k8smode
