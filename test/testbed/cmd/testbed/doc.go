// Command testbed runs the runtime test bed by hand: a real containerd,
// etcd, kube-apiserver and kubelet on this host with Coordino as the pod
// network, for trying Coordino with kubectl. It is what the runtime e2e tests
// build on, without the assertions.
//
//	go run ./test/testbed/cmd/testbed up     # runs until ^C, then tears down
//	go run ./test/testbed/cmd/testbed down   # removes a bed left by a killed run
//
// Needs root, test/testbed/deps.sh, test/testbed/build.sh and `make build`.
package main
