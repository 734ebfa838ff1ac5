package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/coordino/coordino/test/harness"
)

// buildEmpty builds emptybin with the plugin's build flags into dir.
func buildEmpty(dir string) (string, error) {
	out := filepath.Join(dir, "emptybin")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./test/bench/emptybin")
	cmd.Dir = harness.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build emptybin: %v: %s", err, msg)
	}
	return out, nil
}

// execEmpty runs the empty binary n times and adds the CPU its processes
// used to the run's tally. It runs alone, so every child reaped meanwhile is one of them.
func (b *bed) execEmpty(n int) error {
	if b.empty == "" {
		return nil
	}
	before := readCPU(0).children
	for i := 0; i < n; i++ {
		if err := exec.Command(b.empty).Run(); err != nil {
			return fmt.Errorf("exec emptybin: %w", err)
		}
	}
	b.mu.Lock()
	b.emptyCPU += readCPU(0).children - before
	b.emptyN += n
	b.mu.Unlock()
	return nil
}
