package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// newNode starts a node with a running daemon for t, cleaned up with t.
func newNode(t *testing.T, opts harness.NodeOptions) *harness.Node {
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
	if err := n.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	return n
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
