package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

var fakePrimary struct {
	once sync.Once
	dir  string
	err  error
}

// FakePrimaryDir builds test/fakeprimary (a primary plugin that imitates
// other CNIs' result shapes on real veths) once per test process and
// returns the directory holding it, to add to a CNI's bin dirs.
func FakePrimaryDir() (string, error) {
	fakePrimary.once.Do(func() {
		dir, err := os.MkdirTemp("", "coordino-fakeprimary-")
		if err != nil {
			fakePrimary.err = err
			return
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "fakeprimary"), "./test/fakeprimary")
		cmd.Dir = RepoRoot()
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fakePrimary.err = fmt.Errorf("build test/fakeprimary: %v\n%s", err, out)
			return
		}
		fakePrimary.dir = dir
	})
	return fakePrimary.dir, fakePrimary.err
}
