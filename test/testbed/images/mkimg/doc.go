// Command mkimg packs static binaries into a single-layer linux/amd64 image
// and writes it as a docker-archive tarball, so the test bed needs no registry:
// `ctr -n k8s.io images import` loads the result.
//
//	mkimg -o out.tar -tag repo:tag [-tag ...] [-entrypoint /a,b] [-cmd c,d] [-tree dir ...] -file src:/dst ...
package main
