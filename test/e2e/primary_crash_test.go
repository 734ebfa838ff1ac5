package e2e

import (
	"testing"

	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/test/harness"
)

// A primary ADD commits its record while it pins the netns, creates the
// veth and attaches the datapath, so a crash can leave all three with no
// record (and the address reserved only in the dead daemon's memory). The
// next start must remove them before it serves, and the address must be
// free again. The state is made directly: ADD, kill the daemon, drop the
// record. A block with room for two pods proves the address came back.
func TestPrimaryKernelStateWithoutRecordIsReclaimedAtStart(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.93.7.0/30"}})
	c := newCNI(t, n, n.PrimaryConflist("crash", "1.1.0"))
	_, rt, _ := addPod(t, c, "a")
	veths, err := n.HostVeths()
	if err != nil || len(veths) != 1 {
		t.Fatalf("host veths after ADD = %v, %v; want 1", veths, err)
	}
	restartWithoutRecord(t, n, store.Key{Network: "crash", ContainerID: rt.ContainerID, IfName: rt.IfName})

	if veths, err := n.HostVeths(); err != nil || len(veths) != 0 {
		t.Errorf("host veths without a record after restart = %v, %v; want none", veths, err)
	}
	if pins, err := n.Pins(); err != nil || len(pins) != 0 {
		t.Errorf("netns pins without a record after restart = %v, %v; want none", pins, err)
	}
	if got := endpointEntries(t, n); got != 0 {
		t.Errorf("datapath endpoints without a record after restart = %d, want 0", got)
	}
	// Both addresses of the block are free: the crashed ADD's came back.
	addPod(t, c, "b")
	addPod(t, c, "c")
	// The runtime never saw the crashed ADD succeed; its DEL succeeds.
	if err := c.Del(ctx(t), rt); err != nil {
		t.Fatalf("DEL of the crashed ADD: %v", err)
	}
}
