// Package controlplane feeds network policy into the datapath from one of
// its sources: Standalone watches a directory of NetworkPolicy and Namespace
// YAML files; a Kubernetes source (informers) implements the same Source.
package controlplane
