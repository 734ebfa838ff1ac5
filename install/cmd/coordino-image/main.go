// Command coordino-image writes the Coordino image as a docker-archive from
// the binaries of `make build` (`make image` runs it):
//
//	coordino-image -bin bin -tag coordino/coordino:dev -version v0.1.0 -o bin/coordino-image.tar
package main

import (
	"flag"
	"log"

	"github.com/coordino/coordino/install/image"
)

func main() {
	bin := flag.String("bin", "bin", "directory with the binaries of make build")
	tag := flag.String("tag", image.DefaultRef, "image reference to tag the archive with")
	version := flag.String("version", "dev", "version recorded in the org.opencontainers.image.version label")
	out := flag.String("o", "bin/coordino-image.tar", "output docker-archive")
	flag.Parse()
	if err := image.Build(*bin, *tag, *version, *out); err != nil {
		log.Fatal(err)
	}
}
