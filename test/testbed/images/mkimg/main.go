package main

import (
	"flag"
	"log"
	"strings"

	"github.com/coordino/coordino/test/testbed/images/ociimage"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	var files, trees, tags list
	out := flag.String("o", "image.tar", "output docker-archive")
	flag.Var(&tags, "tag", "image reference (repeatable: one image, several names)")
	entrypoint := flag.String("entrypoint", "", "comma separated entrypoint")
	cmd := flag.String("cmd", "", "comma separated cmd")
	flag.Var(&files, "file", "src:/dst executable to add (repeatable)")
	flag.Var(&trees, "tree", "host directory copied as the image's root (repeatable)")
	flag.Parse()
	if len(tags) == 0 || len(files) == 0 {
		log.Fatal("need -tag and at least one -file")
	}
	spec := ociimage.Spec{Entrypoint: split(*entrypoint), Cmd: split(*cmd), Trees: trees}
	for _, s := range files {
		f, err := ociimage.ParseFile(s)
		if err != nil {
			log.Fatal(err)
		}
		spec.Files = append(spec.Files, f)
	}
	img, err := ociimage.Build(spec)
	if err != nil {
		log.Fatal(err)
	}
	if err := ociimage.WriteArchiveTags(*out, tags, img); err != nil {
		log.Fatal(err)
	}
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
