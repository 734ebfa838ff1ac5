package ociimage

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// A tree keeps its directories, permission bits and links; the image is
// written once under every tag.
func TestTreeAndTags(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "usr", "bin"), 0o755))
	must(os.WriteFile(filepath.Join(root, "usr", "bin", "tool"), []byte("#!/bin/sh\n"), 0o755))
	must(os.WriteFile(filepath.Join(root, "cert.pem"), []byte("pem"), 0o644))
	must(os.Symlink("/usr/bin/tool", filepath.Join(root, "usr", "bin", "alias")))
	bin := filepath.Join(t.TempDir(), "main")
	must(os.WriteFile(bin, []byte("main"), 0o600))

	img, err := Build(Spec{Trees: []string{root}, Files: []File{{Src: bin, Dst: "/main"}}, Entrypoint: []string{"/main"}})
	must(err)
	tags := []string{"example.test/a:1", "example.test/b:2"}
	out := filepath.Join(t.TempDir(), "img.tar")
	must(WriteArchiveTags(out, tags, img))

	want, err := img.Digest()
	must(err)
	for _, ref := range tags {
		tag, err := name.NewTag(ref)
		must(err)
		got, err := tarball.ImageFromPath(out, &tag)
		must(err)
		d, err := got.Digest()
		must(err)
		if d != want {
			t.Errorf("%s: digest %v, want %v", ref, d, want)
		}
	}

	layers, err := img.Layers()
	must(err)
	rc, err := layers[0].Uncompressed()
	must(err)
	defer rc.Close()
	entries := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(err)
		if entries[h.Name] != nil {
			t.Errorf("%s written twice", h.Name)
		}
		entries[h.Name] = h
	}
	checks := []struct {
		name string
		typ  byte
		mode int64
		link string
	}{
		{"usr/", tar.TypeDir, 0o755, ""},
		{"usr/bin/tool", tar.TypeReg, 0o755, ""},
		{"cert.pem", tar.TypeReg, 0o644, ""},
		{"usr/bin/alias", tar.TypeSymlink, 0o777, "/usr/bin/tool"},
		{"main", tar.TypeReg, 0o755, ""},
		{"proc/", tar.TypeDir, 0o755, ""},
	}
	for _, c := range checks {
		h := entries[c.name]
		if h == nil {
			t.Errorf("%s missing from the layer", c.name)
			continue
		}
		if h.Typeflag != c.typ || h.Mode != c.mode || h.Linkname != c.link || !h.ModTime.IsZero() && h.ModTime.Unix() != 0 {
			t.Errorf("%s: type %c mode %o link %q time %v, want type %c mode %o link %q and no time",
				c.name, h.Typeflag, h.Mode, h.Linkname, h.ModTime, c.typ, c.mode, c.link)
		}
	}
}
