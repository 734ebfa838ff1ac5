package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// newNode starts a node with a running daemon for t, cleaned up with t.
func newNode(t *testing.T, opts harness.NodeOptions) *harness.Node {
	t.Helper()
	n := newIdleNode(t, opts)
	if err := n.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	return n
}

// newIdleNode is newNode before its daemon starts.
func newIdleNode(t *testing.T, opts harness.NodeOptions) *harness.Node {
	t.Helper()
	privileged.Require(t)
	if err := harness.RequireBinaries(); err != nil {
		t.Fatal(err)
	}
	n, err := harness.NewNode(t.TempDir(), "node-"+harness.RandomSuffix(6), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log tail:\n%s", n.LogTail(60))
		}
		n.Close()
	})
	return n
}

// newPolicyNode starts a node whose daemon reads policy from a directory
// holding the given files (name → YAML); it returns the node and the dir.
func newPolicyNode(t *testing.T, opts harness.NodeOptions, files map[string]string) (*harness.Node, string) {
	t.Helper()
	policyDir := filepath.Join(t.TempDir(), "policies")
	if err := os.MkdirAll(policyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(policyDir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	opts.ExtraArgs = append(opts.ExtraArgs, "--policy-dir", policyDir)
	return newNode(t, opts), policyDir
}

func newPod(t *testing.T, name string) *harness.Pod {
	t.Helper()
	p, err := harness.NewPod(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func newCNI(t *testing.T, n *harness.Node, conflist []byte) *harness.CNI {
	t.Helper()
	c, err := n.NewCNI(conflist)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}
