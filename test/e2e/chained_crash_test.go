package e2e

import (
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/test/harness"
)

// A chained ADD commits its record and attaches the datapath side by side,
// so a crash can leave the datapath attached with no record. The daemon
// must detach such an endpoint when it starts: otherwise it would keep a
// pod's identity, addresses and programs that nothing ever removes. The
// state is made directly: ADD, kill the daemon, drop the record.
func TestChainedAttachWithoutRecordIsDetachedAtStart(t *testing.T) {
	n := newNode(t, harness.NodeOptions{}) // chained-only node
	c, err := n.NewCNI(chainConf(t, n, "crash", "1.1.0", bridgePlugin("cbrcrash"), "10.92.9.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	p := newPod(t, "a")
	rt := harness.RuntimeConf(p, "eth0")
	if _, err := c.Add(ctx(t), rt); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if got := endpointEntries(t, n); got != 1 {
		t.Fatalf("datapath endpoints after ADD = %d, want 1", got)
	}
	restartWithoutRecord(t, n, store.Key{Network: "crash", ContainerID: rt.ContainerID, IfName: rt.IfName})
	if got := endpointEntries(t, n); got != 0 {
		t.Fatalf("datapath endpoints of attachments without a record after restart = %d, want 0", got)
	}
	// DEL of what the runtime still believes in succeeds and the primary's part goes.
	if err := c.Del(ctx(t), rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
}

// restartWithoutRecord kills the node's daemon (SIGKILL), deletes the
// record of k as if the crash had come before it was durable, and starts
// the daemon again.
func restartWithoutRecord(t *testing.T, n *harness.Node, k store.Key) {
	t.Helper()
	if err := n.StopDaemon(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(n.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	err = st.Delete(k)
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.StartDaemon(); err != nil {
		t.Fatal(err)
	}
}

// endpointEntries counts the entries of the node's pinned BPF endpoint map.
func endpointEntries(t *testing.T, n *harness.Node) int {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(n.BPFDir, "cdo_endpoints"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var k, v []byte
	count := 0
	for it := m.Iterate(); it.Next(&k, &v); {
		count++
	}
	return count
}
