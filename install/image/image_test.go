package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// binaries returns a directory holding every binary of Contents: the repo's
// bin/ when `make build ref-plugins` has filled it (as `make test` does
// first), else a fresh build into a temporary directory.
func binaries(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "bin")
	if all(dir) {
		return dir
	}
	dir = t.TempDir()
	cmd := exec.Command("make", "-C", root, "build", "ref-plugins", "BIN="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make build ref-plugins: %v\n%s", err, out)
	}
	return dir
}

func all(dir string) bool {
	for _, b := range Contents {
		if _, err := os.Stat(filepath.Join(dir, b.Name)); err != nil {
			return false
		}
	}
	return true
}

// TestArchive builds the image as `make image` does and reads it back: tag,
// config, and every binary present, executable and statically linked (the
// base is empty: no loader, no libc).
func TestArchive(t *testing.T) {
	out := filepath.Join(t.TempDir(), "coordino.tar")
	if err := Build(binaries(t), DefaultRef, "v1.2.3-test", out); err != nil {
		t.Fatal(err)
	}

	mf, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(out) })
	if err != nil {
		t.Fatal(err)
	}
	if len(mf) != 1 || !slices.Equal(mf[0].RepoTags, []string{DefaultRef}) {
		t.Fatalf("archive tags %+v, want one image tagged %s", mf, DefaultRef)
	}
	img, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	if !slices.Equal(cf.Config.Entrypoint, Entrypoint) {
		t.Errorf("entrypoint %q, want %q", cf.Config.Entrypoint, Entrypoint)
	}
	if v := cf.Config.Labels["org.opencontainers.image.version"]; v != "v1.2.3-test" {
		t.Errorf("version label %q, want v1.2.3-test", v)
	}

	files := map[string][]byte{}
	modes := map[string]int64{}
	links := map[string]string{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeSymlink {
			links["/"+strings.TrimPrefix(hdr.Name, "/")] = hdr.Linkname
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		p := "/" + strings.TrimPrefix(hdr.Name, "/")
		files[p], modes[p] = b, hdr.Mode
	}
	// /var/run/netns/<name> (what runtimes pass) must reach the host's
	// /run/netns that the DaemonSet mounts.
	if got := links["/var/run"]; got != "../run" && got != "/run" {
		t.Errorf("/var/run links to %q, want /run", got)
	}
	if len(files) != len(Contents) {
		t.Errorf("image holds %d files, want the %d of Contents", len(files), len(Contents))
	}
	for _, b := range Contents {
		data, ok := files[b.Path]
		if !ok {
			t.Errorf("%s missing at %s", b.Name, b.Path)
			continue
		}
		if modes[b.Path]&0o111 != 0o111 {
			t.Errorf("%s: mode %o, not executable", b.Path, modes[b.Path])
		}
		if err := static(data); err != nil {
			t.Errorf("%s: %v", b.Path, err)
		}
	}
}

// static fails for anything but a linux/amd64 ELF executable that needs no
// program interpreter and no shared library.
func static(data []byte) error {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return err
	}
	defer f.Close()
	if f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		return fmt.Errorf("ELF %s %s, want an x86-64 executable", f.Machine, f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			return fmt.Errorf("dynamically linked (%s)", p.Type)
		}
	}
	return nil
}

// TestStaticRejectsDynamic keeps the check above honest: a libc-linked host
// binary must fail it.
func TestStaticRejectsDynamic(t *testing.T) {
	data, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	if err := static(data); err == nil {
		t.Fatal("/bin/true passes as static")
	}
}
