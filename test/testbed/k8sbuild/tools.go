//go:build tools

// Package k8sbuild pins the Kubernetes components the runtime test bed builds
// (kube-apiserver, kube-proxy, kubelet). It lives in its own module so the project's go.mod
// never pulls k8s.io/kubernetes; build.sh builds from here.
package k8sbuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
