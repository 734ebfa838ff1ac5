// Package apiserver starts a real etcd and kube-apiserver on 127.0.0.1 for
// tests that need the Kubernetes API (controller, daemon Kubernetes source,
// multi-node e2e), with Coordino's CRDs installed. The binaries are the ones
// test/testbed/build.sh caches; nothing is faked.
//
//	s := apiserver.Start(t)
//	cs := kubernetes.NewForConfigOrDie(s.Config)
//
// Each Start gets its own ports, certificates and etcd data in a fresh
// directory under $TMPDIR (kept with the logs when the test fails), so test
// packages run in parallel; t.Cleanup stops both processes. Without the cached binaries the test is skipped, except under
// CI=true where it fails.
package apiserver
