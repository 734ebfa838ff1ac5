package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// RepoRoot is the repository root, found from this source file.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// BinDir holds the Coordino binaries built by `make build`.
func BinDir() string { return filepath.Join(RepoRoot(), "bin") }

// RefBinDir holds the reference plugins built by `make ref-plugins`.
func RefBinDir() string { return filepath.Join(RepoRoot(), "bin", "ref") }

// DebianBinDir holds Debian's containernetworking-plugins (an older primary).
const DebianBinDir = "/usr/lib/cni"

// RequireBinaries reports which needed binaries are missing, naming the make target.
func RequireBinaries() error {
	for _, p := range []struct{ path, target string }{
		{filepath.Join(BinDir(), "coordino"), "make build"},
		{filepath.Join(BinDir(), "coordino-daemon"), "make build"},
		{filepath.Join(RefBinDir(), "bridge"), "make ref-plugins"},
		{filepath.Join(RefBinDir(), "host-local"), "make ref-plugins"},
	} {
		if _, err := os.Stat(p.path); err != nil {
			return fmt.Errorf("%s missing: run %s first", p.path, p.target)
		}
	}
	return nil
}
