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
	var files list
	out := flag.String("o", "image.tar", "output docker-archive")
	tag := flag.String("tag", "", "image reference")
	entrypoint := flag.String("entrypoint", "", "comma separated entrypoint")
	cmd := flag.String("cmd", "", "comma separated cmd")
	flag.Var(&files, "file", "src:/dst executable to add (repeatable)")
	flag.Parse()
	if *tag == "" || len(files) == 0 {
		log.Fatal("need -tag and at least one -file")
	}
	spec := ociimage.Spec{Entrypoint: split(*entrypoint), Cmd: split(*cmd)}
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
	if err := ociimage.WriteArchive(*out, *tag, img); err != nil {
		log.Fatal(err)
	}
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
