package testbed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildImages compiles the pause and probe programs and the mkimg packer from
// the test/testbed/images module, packs the two images as docker-archive
// tarballs and imports them into the bed's containerd. No registry involved.
func (b *Bed) BuildImages() error {
	src := filepath.Join(b.RepoRoot, "test", "testbed", "images")
	out := b.path("images")
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out+"/", "./pause", "./probe", "./mkimg")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build test images: %w: %s", err, o)
	}
	imgs := []struct{ tar, tag, entry, file string }{
		{"pause.tar", PauseImage, "/pause", "pause:/pause"},
		{"probe.tar", ProbeImage, "/probe,serve", "probe:/probe"},
	}
	for _, im := range imgs {
		tarPath := filepath.Join(out, im.tar)
		mk := exec.Command(filepath.Join(out, "mkimg"), "-o", tarPath, "-tag", im.tag,
			"-entrypoint", im.entry, "-file", filepath.Join(out, im.file))
		if o, err := mk.CombinedOutput(); err != nil {
			return fmt.Errorf("mkimg %s: %w: %s", im.tag, err, o)
		}
		if _, err := b.Ctr("images", "import", tarPath); err != nil {
			return err
		}
	}
	return nil
}
