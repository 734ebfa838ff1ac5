// Package kubernetes holds Coordino's Kubernetes manifests as kustomize
// trees (base, overlays/primary, overlays/chained, uninstall); it has no Go
// code, only the tests that render every tree and check what it produces.
package kubernetes
