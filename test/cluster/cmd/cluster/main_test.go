//go:build linux

package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/coordino/coordino/test/cluster"
	"github.com/coordino/coordino/test/privileged"
)

// TestDownRemovesSavedLogs: the logs a failed up keeps beside the cluster's
// directory (the place its message names) go with `cluster down`.
func TestDownRemovesSavedLogs(t *testing.T) {
	privileged.Require(t)
	dir := filepath.Join(t.TempDir(), "cluster")
	logs := cluster.SavedLogsDir(dir)
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(logs, "worker-1-kubelet.log"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := down(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(logs); !os.IsNotExist(err) {
		t.Errorf("after down, %s: %v, want it removed", logs, err)
	}
}
