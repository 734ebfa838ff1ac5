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
	out := b.path("images")
	if err := BuildImagePrograms(b.RepoRoot, out, "pause", "probe"); err != nil {
		return err
	}
	imgs := []struct{ tar, tag, entry, file string }{
		{"pause.tar", PauseImage, "/pause", "pause:/pause"},
		{"probe.tar", ProbeImage, "/probe,serve", "probe:/probe"},
	}
	for _, im := range imgs {
		tarPath := filepath.Join(out, im.tar)
		if err := PackImage(out, tarPath, im.tag, im.entry, filepath.Join(out, im.file)); err != nil {
			return err
		}
		if _, err := b.Ctr("images", "import", tarPath); err != nil {
			return err
		}
	}
	return nil
}

// BuildImagePrograms builds mkimg and the named programs of the
// test/testbed/images module into out.
func BuildImagePrograms(repoRoot, out string, progs ...string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	args := []string{"build", "-trimpath", "-ldflags=-s -w", "-o", out + "/", "./mkimg"}
	for _, p := range progs {
		args = append(args, "./"+p)
	}
	build := exec.Command("go", args...)
	build.Dir = filepath.Join(repoRoot, "test", "testbed", "images")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if o, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build test images: %w: %s", err, o)
	}
	return nil
}

// PackImage packs files ("src:/dst") into a one-layer image tagged tag with
// the comma-separated entrypoint, written as a docker-archive to tarPath by
// the mkimg that BuildImagePrograms put into toolDir.
func PackImage(toolDir, tarPath, tag, entrypoint string, files ...string) error {
	args := []string{"-o", tarPath, "-tag", tag, "-entrypoint", entrypoint}
	for _, f := range files {
		args = append(args, "-file", f)
	}
	return Mkimg(toolDir, args...)
}

// Mkimg runs the mkimg that BuildImagePrograms put into toolDir with args
// (see test/testbed/images/mkimg).
func Mkimg(toolDir string, args ...string) error {
	if o, err := exec.Command(filepath.Join(toolDir, "mkimg"), args...).CombinedOutput(); err != nil {
		return fmt.Errorf("mkimg %v: %w: %s", args, err, o)
	}
	return nil
}
