// Package api is Coordino's cluster contract: the coordino.io CRD types
// (coordino/v1alpha1), their generated deep-copy functions, the generated
// typed clientset, informers and listers (client/), and the CRD manifests
// (crds/). It is the Kubernetes twin of proto/: the node daemon and the
// controller both import it and it imports neither of them.
//
// Everything under client/, crds/ and zz_generated.* is produced by
// `make generate` (controller-gen and k8s.io/code-generator at pinned
// versions) and committed; `make check-generated` fails when it is stale.
package api
