// Package images holds the offline test images of the runtime test bed: a
// minimal pause, a static network probe, and mkimg, which packs static
// binaries into docker-archive tarballs that `ctr images import` accepts.
//
// It is a separate module so that go-containerregistry stays out of the
// project's go.mod; nothing here needs a registry or network access.
package images
