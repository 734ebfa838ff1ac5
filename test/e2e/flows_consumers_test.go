package e2e

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/coordino/coordino/bpf"
	flowv1 "github.com/coordino/coordino/proto/flow/v1"
	"github.com/coordino/coordino/test/harness"
)

// cfgEmitAllowed is CFG_EMIT_ALLOWED in bpf/coordino.h.
const cfgEmitAllowed = 1

// emitsAllowed reads the flag the BPF programs check before reporting an
// allowed new flow.
func emitsAllowed(t *testing.T, n *harness.Node) bool {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(n.BPFDir, "cdo_config"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var cfg bpf.CoordinoConfig
	if err := m.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Flags&cfgEmitAllowed != 0
}

func waitEmitsAllowed(t *testing.T, n *harness.Node, want bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for emitsAllowed(t, n) != want {
		if time.Now().After(deadline) {
			t.Fatalf("allowed-flow events on = %v, want %v", !want, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recvFlow returns the next TCP event of stream to dst:port.
func recvFlow(t *testing.T, stream flowv1.Observer_FollowFlowsClient, dst netip.Addr, port uint32) *flowv1.FlowEvent {
	t.Helper()
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Protocol == "TCP" && ev.Dst == dst.String() && ev.DstPort == port {
			return ev
		}
	}
}

// flowPods starts db (default-deny ingress, serving 5432) and web
// (unrestricted, serving 8080) on a node with extra daemon args.
func flowPods(t *testing.T, extra ...string) (n *harness.Node, db, web *harness.Pod, dbIP, webIP netip.Addr) {
	t.Helper()
	policyDir := filepath.Join(t.TempDir(), "policies")
	if err := os.MkdirAll(policyDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(policyDir, "deny.yaml"), []byte(denyDBIngress), 0o600); err != nil {
		t.Fatal(err)
	}
	n = newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.94.0.0/24"}, ExtraArgs: append([]string{"--policy-dir", policyDir}, extra...)})
	db, _, dbAddrs := addPod(t, newCNI(t, n, labelledConflist(t, n, map[string]string{"role": "db"})), "db")
	web, _, webAddrs := addPod(t, newCNI(t, n, labelledConflist(t, n, map[string]string{"role": "web"})), "web")
	dbIP, webIP = dbAddrs[0], webAddrs[0]
	for _, s := range []struct {
		p    *harness.Pod
		ip   netip.Addr
		port int
		name string
	}{{db, dbIP, 5432, "db"}, {web, webIP, 8080, "web"}} {
		stop, err := harness.Serve(s.p.NS, s.ip, s.port, s.name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
	return n, db, web, dbIP, webIP
}

// follow opens a FollowFlows stream; cancel ends it.
func follow(t *testing.T, n *harness.Node, req *flowv1.FollowFlowsRequest) (flowv1.Observer_FollowFlowsClient, context.CancelFunc) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(n.RunDir, "coordino.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	stream, err := flowv1.NewObserverClient(conn).FollowFlows(c, req)
	if err != nil {
		t.Fatal(err)
	}
	return stream, cancel
}

// TestAllowedFlowEventsFollowConsumers: the daemon has the datapath report
// allowed new flows only while a FollowFlows client wants them (one not
// asking for dropped_only); drops are reported regardless.
func TestAllowedFlowEventsFollowConsumers(t *testing.T) {
	n, db, web, dbIP, webIP := flowPods(t)
	if emitsAllowed(t, n) {
		t.Fatal("allowed flows reported with no consumer")
	}

	// A dropped_only client gets drops but does not switch allowed flows on.
	drops, _ := follow(t, n, &flowv1.FollowFlowsRequest{DroppedOnly: true})
	time.Sleep(200 * time.Millisecond) // let the server subscribe
	if got, err := harness.Dial(web.NS, dbIP, 5432); err == nil {
		t.Fatalf("web reached db through a default-deny policy: %q", got)
	}
	if ev := recvFlow(t, drops, dbIP, 5432); ev.Verdict != "dropped" || ev.Reason != "policy-denied" {
		t.Fatalf("drop event = %+v", ev)
	}
	if emitsAllowed(t, n) {
		t.Fatal("a dropped_only client switched allowed-flow events on")
	}

	// A client that wants everything switches them on and sees db→web.
	all, stopAll := follow(t, n, &flowv1.FollowFlowsRequest{})
	waitEmitsAllowed(t, n, true)
	if got, err := harness.Dial(db.NS, webIP, 8080); err != nil || got != "web" {
		t.Fatalf("db→web: %q %v", got, err)
	}
	if ev := recvFlow(t, all, webIP, 8080); ev.Verdict != "allowed" || ev.Src != dbIP.String() || !strings.Contains(ev.Endpoint, "/eth0") {
		t.Fatalf("allowed flow event = %+v", ev)
	}

	// When it leaves they go off again; drops keep coming.
	stopAll()
	waitEmitsAllowed(t, n, false)
	if _, err := harness.Dial(web.NS, dbIP, 5432); err == nil {
		t.Fatal("web reached db through a default-deny policy")
	}
	if ev := recvFlow(t, drops, dbIP, 5432); ev.Verdict != "dropped" {
		t.Fatalf("drop event = %+v", ev)
	}
}

// TestFlowLogGetsAllowedFlows: a configured --flow-log is a permanent
// consumer of allowed flows.
func TestFlowLogGetsAllowedFlows(t *testing.T) {
	flowLog := filepath.Join(t.TempDir(), "flows.jsonl")
	n, db, _, _, webIP := flowPods(t, "--flow-log", flowLog)
	if !emitsAllowed(t, n) {
		t.Fatal("allowed-flow events off although --flow-log is set")
	}
	if got, err := harness.Dial(db.NS, webIP, 8080); err != nil || got != "web" {
		t.Fatalf("db→web: %q %v", got, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		data, _ := os.ReadFile(flowLog)
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, `"verdict":"allowed"`) && strings.Contains(line, `"dst":"`+webIP.String()+`"`) && strings.Contains(line, `"dstPort":8080`) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("flow log lacks the allowed db→web flow: %s", data)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
