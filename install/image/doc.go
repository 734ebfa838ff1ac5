// Package image defines the Coordino container image: which binaries go
// where, its entrypoint and labels, and builds it offline as a docker-archive
// (go-containerregistry through test/testbed/images/ociimage; no registry or
// container engine).
package image
