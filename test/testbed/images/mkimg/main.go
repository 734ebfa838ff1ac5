package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
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
	if err := run(*out, *tag, *entrypoint, *cmd, files); err != nil {
		log.Fatal(err)
	}
}

func run(out, tag, entrypoint, cmd string, files []string) error {
	layerTar, err := layer(files)
	if err != nil {
		return err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if entrypoint != "" {
		cf.Config.Entrypoint = strings.Split(entrypoint, ",")
	}
	if cmd != "" {
		cf.Config.Cmd = strings.Split(cmd, ",")
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	ref, err := name.ParseReference(tag)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, ref, img)
}

// layer returns a tar with the given files plus the empty directories a
// runtime expects to mount over (/proc, /sys, /dev, /etc, /tmp).
func layer(files []string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	mkdirs := func(p string) error {
		var parents []string
		for d := path.Dir(strings.TrimPrefix(p, "/")); d != "." && d != "/"; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if seen[d] {
				continue
			}
			seen[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, d := range []string{"/proc", "/sys", "/dev", "/etc", "/tmp"} {
		if err := mkdirs(d + "/x"); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		src, dst, ok := strings.Cut(f, ":")
		if !ok || !strings.HasPrefix(dst, "/") {
			return nil, fmt.Errorf("bad -file %q, want src:/dst", f)
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		if err := mkdirs(dst); err != nil {
			return nil, err
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: 0o755, Size: int64(len(b))}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
