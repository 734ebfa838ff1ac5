package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	flowv1 "github.com/coordino/coordino/proto/flow/v1"
	"github.com/coordino/coordino/test/harness"
)

const denyDBIngress = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db-deny-ingress, namespace: default}
spec:
  podSelector: {matchLabels: {role: db}}
  policyTypes: [Ingress]
`

// labelledConflist is a primary conflist carrying the pod's labels the
// standalone way (args.cni.labels).
func labelledConflist(t *testing.T, n *harness.Node, labels map[string]string) []byte {
	var ls []map[string]string
	for k, v := range labels {
		ls = append(ls, map[string]string{"key": k, "value": v})
	}
	b, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "coordino", "plugins": []any{
		map[string]any{"type": "coordino", "runDir": n.RunDir, "args": map[string]any{"cni": map[string]any{"labels": ls}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFlowEventsStreamAndLog(t *testing.T) {
	dir := t.TempDir()
	policyDir := filepath.Join(dir, "policies")
	os.MkdirAll(policyDir, 0o700)
	if err := os.WriteFile(filepath.Join(policyDir, "deny.yaml"), []byte(denyDBIngress), 0o600); err != nil {
		t.Fatal(err)
	}
	flowLog := filepath.Join(dir, "flows.jsonl")
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.93.0.0/24"}, ExtraArgs: []string{"--policy-dir", policyDir, "--flow-log", flowLog}})

	db, _, dbAddrs := addPod(t, newCNI(t, n, labelledConflist(t, n, map[string]string{"role": "db"})), "db")
	web, _, _ := addPod(t, newCNI(t, n, labelledConflist(t, n, map[string]string{"role": "web"})), "web")
	stop, err := harness.Serve(db.NS, dbAddrs[0], 5432, "db")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	conn, err := grpc.NewClient("unix://"+filepath.Join(n.RunDir, "coordino.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := flowv1.NewObserverClient(conn).FollowFlows(c, &flowv1.FollowFlowsRequest{DroppedOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	// The stream is established once the server has subscribed; give it a moment, then retry the probe.
	time.Sleep(200 * time.Millisecond)
	if got, err := harness.Dial(web.NS, dbAddrs[0], 5432); err == nil {
		t.Fatalf("web reached db through a default-deny policy: %q", got)
	}
	// Other drops may come first (e.g. a pod's own IPv6 chatter); find ours.
	var ev *flowv1.FlowEvent
	for ev == nil || ev.Protocol != "TCP" {
		if ev, err = stream.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	if ev.Verdict != "dropped" || ev.Dst != dbAddrs[0].String() || ev.DstPort != 5432 || ev.Direction != "ingress" || !strings.Contains(ev.Endpoint, "/eth0") {
		t.Fatalf("flow event = %+v", ev)
	}
	// The same event is in the JSON-lines log.
	deadline := time.Now().Add(5 * time.Second)
	for {
		data, _ := os.ReadFile(flowLog)
		if strings.Contains(string(data), `"verdict":"dropped"`) && strings.Contains(string(data), dbAddrs[0].String()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("flow log lacks the drop: %s", data)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The node itself is always allowed (probes).
	if got, err := harness.Dial(n.NS, dbAddrs[0], 5432); err != nil || got != "db" {
		t.Fatalf("node→db under default-deny: %q %v", got, err)
	}
}
