package endpoint

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/test/privileged"
)

// TestStatusOKWhileBlocksFullAddTryAgain: a node whose blocks are merely full
// is not broken. STATUS must succeed (failing it makes the runtime refuse
// every pod on the node until a block arrives); the ADD that finds no
// address fails alone with "try again later", naming the reason. Fails on
// the old code, whose STATUS answered code 50 "exhausted".
func TestStatusOKWhileBlocksFullAddTryAgain(t *testing.T) {
	privileged.Require(t)
	m := newTestManager(t, "10.98.0.0/30") // two assignable addresses
	for range 2 {
		if _, err := m.cfg.Pool.Allocate(); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Status(context.Background()); err != nil {
		t.Fatalf("STATUS with full blocks = %v, want success", err)
	}
	pod := newTestNS(t)
	_, err := m.Add(context.Background(), addInvocation(store.Key{Network: "net", ContainerID: "full", IfName: "eth0"}, pod.Path()))
	var cniErr *types.Error
	if !errors.As(err, &cniErr) || cniErr.Code != types.ErrTryAgainLater {
		t.Fatalf("ADD on a full node = %#v, want CNI code %d", err, types.ErrTryAgainLater)
	}
	if !strings.Contains(cniErr.Msg, "blocks are full") || !strings.Contains(cniErr.Msg, "IPv4 10.98.0.0/30: 2 of 2") {
		t.Fatalf("ADD error %q does not say the node's blocks are full", cniErr.Msg)
	}

	// A family with no serving block left is not transient: STATUS fails.
	if err := m.cfg.Pool.SetBlocks([]ipam.BlockSpec{{Prefix: m.cfg.Pool.Usage()[0].Prefix, Releasing: true}}); err != nil {
		t.Fatal(err)
	}
	if err := m.Status(context.Background()); !errors.As(err, &cniErr) || cniErr.Code != types.ErrPluginNotAvailable || !strings.Contains(cniErr.Msg, "being released") {
		t.Fatalf("STATUS with every block releasing = %v, want code %d", err, types.ErrPluginNotAvailable)
	}
}
