package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	flowv1 "github.com/coordino/coordino/proto/flow/v1"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// fakeDaemon serves two endpoints and streams events one at a time.
type fakeDaemon struct {
	inspectv1.UnimplementedInspectorServer
	flowv1.UnimplementedObserverServer
	events []*flowv1.FlowEvent
}

func (fakeDaemon) ListEndpoints(context.Context, *inspectv1.ListEndpointsRequest) (*inspectv1.ListEndpointsResponse, error) {
	return &inspectv1.ListEndpointsResponse{Endpoints: []*inspectv1.Endpoint{
		{Key: "coordino/0123456789abcdef/eth0", PodNamespace: "default", PodName: "web", Ips: []string{"10.0.0.2"}},
		{Key: "coordino/fedcba9876543210/eth0", PodNamespace: "kube-system", PodName: "a-much-longer-pod-name", Ips: []string{"10.0.0.3"}},
	}}, nil
}

func (d fakeDaemon) FollowFlows(_ *flowv1.FollowFlowsRequest, s flowv1.Observer_FollowFlowsServer) error {
	if err := s.SendHeader(nil); err != nil {
		return err
	}
	for _, ev := range d.events {
		time.Sleep(50 * time.Millisecond) // each row printed on its own
		if err := s.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

// Rows printed one by one while following line up with the header; the
// endpoint is the pod (the key when the pod is unknown); times are UTC and
// say so.
func TestFollowTableAlignsAndNamesPods(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 890_000_000, time.UTC).UnixNano()
	d := fakeDaemon{events: []*flowv1.FlowEvent{
		{TimeUnixNano: t0, Endpoint: "coordino/0123456789abcdef/eth0", Direction: "ingress", Verdict: "dropped", Reason: "policy-denied",
			Protocol: "TCP", Src: "10.0.0.3", SrcPort: 40000, Dst: "10.0.0.2", DstPort: 80, LocalIdentity: 256, RemoteIdentity: 257},
		{TimeUnixNano: t0, Endpoint: "coordino/fedcba9876543210/eth0", Direction: "egress", Verdict: "allowed", Reason: "policy",
			Protocol: "UDP", Src: "10.0.0.3", SrcPort: 5353, Dst: "10.0.0.2", DstPort: 53, LocalIdentity: 257, RemoteIdentity: 256},
		{TimeUnixNano: t0, Endpoint: "coordino/00000000/eth0", Direction: "egress", Verdict: "dropped", Reason: "policy-denied",
			Protocol: "TCP", Src: "10.0.0.9", Dst: "10.0.0.2", DstPort: 80},
		{TimeUnixNano: t0, Endpoint: "coordino/abcdef0123456789abcdef0123456789abcdef0123456789/eth0", Direction: "egress", Verdict: "dropped",
			Reason: "policy-denied", Protocol: "TCP", Src: "10.0.0.9", Dst: "10.0.0.2", DstPort: 80},
	}}
	sock := serveGRPC(t, func(g *grpc.Server) {
		inspectv1.RegisterInspectorServer(g, d)
		flowv1.RegisterObserverServer(g, d)
	})
	code, out, stderr, _ := runTimed("flows", "--follow", "--socket", sock)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("want a header and 4 rows:\n%s", out)
	}
	for _, col := range []string{"ENDPOINT", "VERDICT", "SOURCE", "DESTINATION", "IDENTITIES"} {
		at := strings.Index(lines[0], col)
		for i, l := range lines[1:] {
			if i == 3 && col != "IDENTITIES" && col != "ENDPOINT" {
				continue // a key longer than its column: the next columns' slack takes it up
			}
			if at >= len(l) || l[at-2:at] != "  " || l[at] == ' ' {
				t.Errorf("column %s (at %d) does not line up:\n%s", col, at, out)
			}
		}
	}
	for i, want := range []string{"2026-03-04T05:06:07.890Z  default/web ", "2026-03-04T05:06:07.890Z  kube-system/a-much-longer-pod-name ",
		"2026-03-04T05:06:07.890Z  coordino/00000000/eth0 "} {
		if !strings.HasPrefix(lines[i+1], want) {
			t.Errorf("row %d = %q, want it to start with %q", i, lines[i+1], want)
		}
	}
}

// Allowed flows are not remembered: asking for them without --follow is
// an error that says so, not an empty answer.
func TestAllowedFlowsNeedFollow(t *testing.T) {
	code, out, stderr, _ := runTimed("flows", "--verdict", "allowed", "--socket", "/nonexistent")
	if code != 2 || out != "" || !strings.Contains(stderr, "--verdict allowed needs --follow") {
		t.Fatalf("exit %d: %q %s", code, out, stderr)
	}
}
