// Package testbed runs a real single-node Kubernetes runtime stack on the
// host for Coordino's runtime end-to-end tests: containerd v2 with its CRI
// plugin, crictl, etcd, kube-apiserver and kubelet, all built from upstream Go
// modules by build.sh into a versioned cache, plus offline-built images.
//
// Everything a bed starts or changes is recorded under its directory (pid
// files with process start times, the sysctls and iptables chains it found),
// so Teardown can undo a previous run even after the test binary was killed:
// processes are stopped by recorded PID only, mounts under the bed are
// detached, the bed's cgroups are emptied and removed, and kubelet's iptables
// chains are deleted when the bed created them.
//
// The bed never touches the host's /etc/cni/net.d or /opt/cni/bin: containerd
// is configured with the bed's own CNI conf and bin dirs, one conf dir per
// runtime handler, so Coordino and a reference network can be compared in the
// same run.
package testbed
