package harness

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/privileged"
)

// TestPodCloseWhileNetnsFileOpen: a child that another goroutine is forking
// holds a copy of the pod's netns fd until it execs (a daemon restart during
// a DEL, in test/fault). Close must still remove the netns file: a plain
// unmount fails with EBUSY then and left the namespace in /run/netns.
func TestPodCloseWhileNetnsFileOpen(t *testing.T) {
	privileged.Require(t)
	p, err := NewPod("close")
	if err != nil {
		t.Fatal(err)
	}
	path := p.NS.Path()
	f, err := os.Open(path) // the forked child's copy
	if err != nil {
		p.Close()
		t.Fatal(err)
	}
	p.Close()
	f.Close()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		_ = os.Remove(path)
		t.Fatalf("%s left behind by Close: %v", path, err)
	}
}
