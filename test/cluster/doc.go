// Package cluster runs a multi-node Kubernetes cluster on one machine for
// Coordino's cluster end-to-end tests and the upstream conformance suites.
//
// Every machine of the cluster is a network namespace joined to an underlay
// bridge inside a namespace of its own; only the host reaches the underlay,
// through one veth, so kubectl and the tests can talk to the API server.
// The control plane machine runs etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler; each worker runs containerd,
// kubelet and kube-proxy (nftables mode) in its own mount namespace, where
// the paths a node owns (/etc/cni/net.d, /opt/cni/bin, /run/coordino,
// /var/lib/kubelet, /sys/fs/bpf, ...) are bind mounts of per-node
// directories under the cluster's directory, and with its own cgroup root.
// Coordino is installed as users install it: the image imported into each
// node's containerd, then `kubectl apply -k install/kubernetes/overlays/primary`.
//
// All upstream programs come from test/testbed/build.sh's versioned cache.
// Everything the cluster creates is recorded under its directory, so Down
// (and Teardown after a killed run) removes processes by recorded PID, the
// namespaces, the host veth, the cgroup tree and the mount points it made.
package cluster
