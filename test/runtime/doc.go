// Package runtime holds Coordino's runtime end-to-end tests: a real
// containerd v2 (CRI) and a real kubelet drive the Coordino CNI plugin and
// daemon on this host, through the test bed in test/testbed.
//
// The tests are opt-in, so `go test ./...` stays fast and needs nothing
// prebuilt: they run only with COORDINO_RUNTIME_E2E=1, as root (see
// test/privileged), after test/testbed/deps.sh, test/testbed/build.sh and
// `make build ref-plugins`. COORDINO_RUNTIME_E2E=cri runs only the crictl
// part (no etcd, kube-apiserver or kubelet needed).
package runtime
