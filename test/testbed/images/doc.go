// Package images holds the offline test images of the runtime test bed: a
// minimal pause, a static network probe, and mkimg, which packs static
// binaries into docker-archive tarballs that `ctr images import` accepts.
// ociimage is the packing code mkimg shares with the Coordino image
// (install/image, `make image`).
//
// It is a separate module so that the test programs stay apart from the
// project; the main module imports ociimage through a replace directive.
// Nothing here needs a registry or network access.
package images
