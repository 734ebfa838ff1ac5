package ociimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
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

// Spec describes an image: its files (all mode 0755), links, directory
// trees and config.
type Spec struct {
	Files    []File
	Symlinks []Symlink
	// Trees are host directories copied as the image's root: their
	// directories, regular files (with their permission bits) and
	// symbolic links, under the same paths. Files and Symlinks come after
	// them and must not name a path a tree holds.
	Trees      []string
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
	layerTar, err := layer(spec.Trees, spec.Files, spec.Symlinks)
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
	return WriteArchiveTags(out, []string{ref}, img)
}

// WriteArchiveTags is WriteArchive with several references to the one image
// (its layers are stored once).
func WriteArchiveTags(out string, refs []string, img v1.Image) error {
	tags := map[name.Reference]v1.Image{}
	for _, ref := range refs {
		tag, err := name.NewTag(ref)
		if err != nil {
			return err
		}
		tags[tag] = img
	}
	return tarball.MultiRefWriteToFile(out, tags)
}

// layer returns a tar with the given files and links plus the empty
// directories a runtime expects to mount over (/proc, /sys, /dev, /etc, /tmp).
func layer(trees []string, files []File, links []Symlink) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	for _, t := range trees {
		if err := addTree(tw, t, seen); err != nil {
			return nil, err
		}
	}
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

// addTree writes root's contents under the image's root, in lexical order,
// with zero timestamps and owner root. Directories already written (seen)
// are not repeated; other file types are refused.
func addTree(tw *tar.Writer, root string, seen map[string]bool) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if seen[rel] {
				return nil
			}
			seen[rel] = true
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: rel + "/", Mode: int64(info.Mode().Perm())})
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: rel, Linkname: target, Mode: 0o777})
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: int64(info.Mode().Perm()), Size: int64(len(b))}); err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		default:
			return fmt.Errorf("%s: %v is not a directory, regular file or symbolic link", p, d.Type())
		}
	})
}
