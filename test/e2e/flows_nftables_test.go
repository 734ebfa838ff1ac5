package e2e

import (
	"strings"
	"testing"
	"time"

	flowv1 "github.com/coordino/coordino/proto/flow/v1"
	"github.com/coordino/coordino/test/harness"
)

// TestFlowEventsNFTables: with --datapath=nftables the daemon's flow
// stream (coordinoctl flows) carries the same events as in eBPF mode: a
// denied connection as policy-denied at the receiving pod's ingress, and
// allowed new flows only while a client wants them.
func TestFlowEventsNFTables(t *testing.T) {
	n, db, web, dbIP, webIP := flowPods(t, "--datapath=nftables")
	drops, _ := follow(t, n, &flowv1.FollowFlowsRequest{DroppedOnly: true})
	time.Sleep(200 * time.Millisecond) // let the server subscribe
	if got, err := harness.Dial(web.NS, dbIP, 5432); err == nil {
		t.Fatalf("web reached db through a default-deny policy: %q", got)
	}
	ev := recvFlow(t, drops, dbIP, 5432)
	if ev.Verdict != "dropped" || ev.Reason != "policy-denied" || ev.Direction != "ingress" || ev.Src != webIP.String() ||
		!strings.Contains(ev.Endpoint, "/eth0") || ev.LocalIdentity == 0 || ev.RemoteIdentity == 0 {
		t.Fatalf("drop event = %+v", ev)
	}

	all, _ := follow(t, n, &flowv1.FollowFlowsRequest{})
	time.Sleep(200 * time.Millisecond) // the allowed-flow chains are filled as it subscribes
	if got, err := harness.Dial(db.NS, webIP, 8080); err != nil || got != "web" {
		t.Fatalf("db→web: %q %v", got, err)
	}
	if ev := recvFlow(t, all, webIP, 8080); ev.Verdict != "allowed" || ev.Src != dbIP.String() || ev.Reason != "not-isolated" {
		t.Fatalf("allowed flow event = %+v", ev)
	}
}
