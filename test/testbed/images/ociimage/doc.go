// Package ociimage assembles single-layer linux/amd64 images from static
// files and directory trees and writes them as docker-archive tarballs, offline: no registry, no
// container engine. It is shared by the test images (mkimg) and the Coordino
// image (install/image).
package ociimage
