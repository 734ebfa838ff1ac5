package e2e

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/coordino/coordino/proto/cni/v1/wire"
	"github.com/coordino/coordino/proto/deletequeue"
	"github.com/coordino/coordino/test/harness"
)

// TestQueuedDelNeverRemovesANewerAttachment queues a DEL (as the plugin does
// when the daemon is briefly unreachable) stamped by a clock that was ahead
// and then stepped back, re-ADDs the same pod, and lets the daemon drain its
// queue on restart: the DEL belongs to the old attachment and must not
// remove the new one. Before attachments were ordered by the queue itself,
// the drain compared wall-clock times and removed the new attachment.
func TestQueuedDelNeverRemovesANewerAttachment(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.86.0.0/24"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	p, rt, _ := addPod(t, c, "a")

	queue := filepath.Join(n.RunDir, wire.DeleteQueueDir)
	keyDir := filepath.Join(queue, deletequeue.KeyDir("coordino", rt.ContainerID, rt.IfName))
	if err := os.MkdirAll(keyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	data, err := wire.AppendQueuedDelete(nil, &wire.Request{
		ContainerID: rt.ContainerID, Netns: p.NS.Path(), IfName: rt.IfName,
		Stdin: pluginConf(n.RunDir, nil),
	}, time.Now().Add(time.Hour).UnixNano(), deletequeue.Format.Stamp())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(keyDir, "99999999999999999999-x.del"), data, 0o600); err != nil {
		t.Fatal(err)
	}

	// The runtime saw the DEL succeed and adds the pod again.
	if _, err := c.Add(ctx(t), rt); err != nil {
		t.Fatalf("re-ADD: %v", err)
	}
	if err := n.StopDaemon(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := n.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(queue, "*")); len(left) != 0 {
		t.Fatalf("queue not empty: %v", left)
	}
	if err := c.Check(ctx(t), rt); err != nil {
		t.Fatalf("the newer attachment is gone: CHECK: %v", err)
	}
	if err := n.Leaks(1); err != nil {
		t.Fatal(err)
	}
}
