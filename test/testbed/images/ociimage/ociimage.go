package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultPath is the PATH of images that do not set Env.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// File is one executable copied from the build host into the image.
type File struct {
	Src string // path on the build host
	Dst string // absolute path in the image
}

// Symlink is a symbolic link in the image.
type Symlink struct {
	Path   string // absolute path in the image
	Target string
}

// Spec describes an image: its files (all mode 0755), links and config.
type Spec struct {
	Files      []File
	Symlinks   []Symlink
	Entrypoint []string
	Cmd        []string
	Env        []string // default: DefaultPath
	Labels     map[string]string
}

// ParseFile parses "src:/dst".
func ParseFile(s string) (File, error) {
	src, dst, ok := strings.Cut(s, ":")
	if !ok || src == "" || !strings.HasPrefix(dst, "/") {
		return File{}, fmt.Errorf("bad file %q, want src:/dst", s)
	}
	return File{Src: src, Dst: dst}, nil
}

// Build returns the image. Timestamps are zero, so equal inputs give an
// equal digest.
func Build(spec Spec) (v1.Image, error) {
	layerTar, err := layer(spec.Files, spec.Symlinks)
	if err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = spec.Env
	if len(cf.Config.Env) == 0 {
		cf.Config.Env = []string{DefaultPath}
	}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.Labels = spec.Labels
	return mutate.ConfigFile(img, cf)
}

// WriteArchive writes img as a docker-archive tagged ref, the format that
// `ctr images import`, `docker load` and `kind load image-archive` accept.
func WriteArchive(out, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, tag, img)
}

// layer returns a tar with the given files and links plus the empty
// directories a runtime expects to mount over (/proc, /sys, /dev, /etc, /tmp).
func layer(files []File, links []Symlink) ([]byte, error) {
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
		if !strings.HasPrefix(f.Dst, "/") {
			return nil, fmt.Errorf("image path %q is not absolute", f.Dst)
		}
		b, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, err
		}
		if err := mkdirs(f.Dst); err != nil {
			return nil, err
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Dst, "/"), Mode: 0o755, Size: int64(len(b))}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	for _, l := range links {
		if !strings.HasPrefix(l.Path, "/") {
			return nil, fmt.Errorf("image path %q is not absolute", l.Path)
		}
		if err := mkdirs(l.Path); err != nil {
			return nil, err
		}
		hdr := &tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(l.Path, "/"), Linkname: l.Target, Mode: 0o777}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
