package ociimage

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A tree holding something that is not a file, directory or link is refused.
func TestTreeRefusesFIFO(t *testing.T) {
	root := t.TempDir()
	if err := os.Symlink("x", filepath.Join(root, "ok")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(Spec{Trees: []string{root}}); err == nil {
		t.Error("a FIFO in the tree was packed")
	}
}
