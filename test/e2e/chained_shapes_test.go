package e2e

import (
	"encoding/json"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/coordino/coordino/test/harness"
)

// allowFromClients isolates role=server pods for ingress and lets only
// role=client pods in: the client's packets pass only if Coordino recorded
// the client's address, and the other pod's are dropped only if the server
// is enforced.
const allowFromClients = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-clients, namespace: default}
spec:
  podSelector: {matchLabels: {role: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: client}}}]
`

// TestChainedOntoOtherPrimaryShapes chains Coordino after a primary that
// creates real veths and addresses but reports them the way Calico, the AWS
// VPC CNI (current and before 1.12), Flannel (bridge delegate) and a
// sandbox-less primary do. Before Coordino looked the pod interface up by
// CNI_NETNS and CNI_IFNAME, the host-side-only shapes failed ADD with code 7.
func TestChainedOntoOtherPrimaryShapes(t *testing.T) {
	policyDir, err := harness.NewPolicyDir(t.TempDir(), "server.yaml", allowFromClients)
	if err != nil {
		t.Fatal(err)
	}
	n := newNode(t, harness.NodeOptions{ExtraArgs: []string{"--policy-dir", policyDir}})
	fakeDir, err := harness.FakePrimaryDir()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		shape, version, subnet string
		delegate               map[string]any
	}{
		{"calico", "0.3.1", "10.95.1.0/24", nil},
		{"aws-legacy", "0.3.1", "10.95.2.0/24", nil},
		{"aws-vpc", "1.0.0", "10.95.3.0/24", nil},
		{"no-sandbox", "1.1.0", "10.95.4.0/24", nil},
		{"flannel", "0.3.1", "10.95.5.0/24", map[string]any{"type": "bridge", "bridge": "cnifl" + harness.RandomSuffix(4),
			"isDefaultGateway": true, "hairpinMode": true}},
	}
	for _, tc := range cases {
		t.Run(tc.shape, func(t *testing.T) {
			primary := map[string]any{"type": "fakeprimary", "shape": tc.shape,
				"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]any{{{"subnet": tc.subnet}}},
					"dataDir": filepath.Join(n.Dir, "host-local-"+tc.shape)}}
			if tc.delegate != nil {
				primary["delegate"] = tc.delegate
			}
			conf, err := json.Marshal(map[string]any{"cniVersion": tc.version, "name": "net-" + tc.shape,
				"plugins": []any{primary, map[string]any{"type": "coordino", "runDir": n.RunDir}}})
			if err != nil {
				t.Fatal(err)
			}
			type attached struct {
				pod  *harness.Pod
				cni  *harness.CNI
				rt   *libcni.RuntimeConf
				addr netip.Addr
			}
			pods := map[string]*attached{}
			for _, role := range []string{"server", "client", "other"} {
				labelled, err := harness.WithPodLabels(conf, map[string]string{"role": role})
				if err != nil {
					t.Fatal(err)
				}
				c, err := n.NewCNI(labelled, harness.BinDir(), harness.RefBinDir(), fakeDir)
				if err != nil {
					t.Fatal(err)
				}
				p := newPod(t, role)
				rt := harness.RuntimeConf(p, "eth0")
				res, err := c.Add(ctx(t), rt)
				if err != nil {
					t.Fatalf("chained ADD of %s after a %s-shaped primary: %v", role, tc.shape, err)
				}
				addrs, err := harness.Addresses(res)
				if err != nil || len(addrs) != 1 || !netip.MustParsePrefix(tc.subnet).Contains(addrs[0]) {
					t.Fatalf("result does not carry the primary's address: %s (%v)", harness.ResultJSON(res), err)
				}
				pods[role] = &attached{pod: p, cni: c, rt: rt, addr: addrs[0]}
				t.Cleanup(func() { _ = c.Del(ctx(t), rt) })
				if err := checkCoordinoOnly(n, "net-"+tc.shape, "1.0.0", rt.ContainerID, p.NS.Path(), res); err != nil {
					t.Fatalf("Coordino CHECK of %s: %v", role, err)
				}
			}
			if v, err := n.Metric("coordino_endpoints", `mode="chained"`); err != nil || v != 3 {
				t.Fatalf("chained endpoints recorded = %v %v, want 3", v, err)
			}
			if tc.shape == "calico" {
				// A host-side-only prevResult whose address is not on the pod
				// interface says nothing Coordino can trust: code 7, no state.
				prev := map[string]any{"cniVersion": "1.0.0", "interfaces": []any{map[string]any{"name": "cali0"}},
					"ips": []any{map[string]any{"address": "10.95.9.9/32"}}}
				stdin := pluginConf(n.RunDir, map[string]any{"name": "net-" + tc.shape, "cniVersion": "1.0.0", "prevResult": prev})
				_, cniErr, _, err := harness.ExecPlugin(harness.Invocation{Command: "ADD", ContainerID: "stray", Netns: pods["server"].pod.NS.Path(), IfName: "eth0", Stdin: stdin})
				if err != nil || cniErr == nil || cniErr.Code != 7 || !strings.Contains(cniErr.Msg, "prevResult.ips") {
					t.Fatalf("ADD with addresses not on the pod interface = %+v %v, want code 7 naming prevResult.ips", cniErr, err)
				}
				if v, err := n.Metric("coordino_endpoints", `mode="chained"`); err != nil || v != 3 {
					t.Fatalf("a refused ADD left a record: %v %v", v, err)
				}
			}
			server := pods["server"]
			stop, err := harness.ServeTCPEcho(server.pod.NS, server.addr, 80)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			out, err := harness.ProbeAll([]harness.Probe{
				{From: pods["client"].pod.NS, To: server.addr, Port: 80, Proto: "tcp"},
				{From: pods["other"].pod.NS, To: server.addr, Port: 80, Proto: "tcp"},
			}, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if out[0] != harness.Reached || out[1] != harness.Blocked {
				t.Fatalf("client→server %v (want reached), other→server %v (want blocked)", out[0], out[1])
			}
			for role, a := range pods {
				if err := a.cni.Del(ctx(t), a.rt); err != nil {
					t.Fatalf("DEL %s: %v", role, err)
				}
				if linkExists(a.pod.NS, "eth0") {
					t.Fatalf("the primary's DEL did not run after Coordino's for %s", role)
				}
			}
			if v, err := n.Metric("coordino_endpoints", `mode="chained"`); err != nil || v != 0 {
				t.Fatalf("chained endpoints left after DEL = %v %v", v, err)
			}
		})
	}
}
