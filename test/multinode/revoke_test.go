package multinode

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/coordino/coordino/bpf"
)

// TestPolicyCutsHostRoutedFlows: a policy change applies at once to a flow
// already host-routed between nodes, whose packets both ends answer from
// their memo of conntrack (cdo_flow_memo): a steady UDP stream from a to b
// stops as soon as a daemon has loaded a policy that denies it, whether the
// policy isolates b's ingress on b's node or a's egress on a's node, and
// the drops are counted as revoked. Were a memo's answer kept across the
// policy revision, the stream would run on for up to a second.
func TestPolicyCutsHostRoutedFlows(t *testing.T) {
	c := newClusterWith(t, direct, 2, benchPolicyArgs(t))
	a, b := c.addPod(c.nodes[0]), c.addPod(c.nodes[1])
	for _, tc := range []struct {
		name, direction string
		on              *node
		port            int
	}{
		{"ingress-on-the-receiving-node", "Ingress", c.nodes[1], echoPort + 8},
		{"egress-on-the-sending-node", "Egress", c.nodes[0], echoPort + 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startUDPStream(t, a, b, tc.port)
			before := hostRouteStats(t, c.nodes[0])
			s.expectFlowing(t, "before the policy")
			if got := statDelta(before, hostRouteStats(t, c.nodes[0]), bpf.CoordinoHostrouteStatHR_STAT_OUT_REDIRECTED); got < 20 {
				t.Fatalf("host routing redirected %d of the stream's datagrams, want >= 20", got)
			}
			revoked := func() float64 {
				t.Helper()
				v, err := tc.on.Metric("coordino_datapath_packets_total", `reason="policy-revoked"`)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
			revokedBefore := revoked()
			dir := filepath.Join(tc.on.Dir, "policies")
			deny := fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: default}
spec: {podSelector: {}, policyTypes: [%s]}
`, tc.direction)
			if err := tc.on.WritePolicy(dir, "deny.yaml", []byte(deny), 30*time.Second); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := tc.on.WritePolicy(dir, "deny.yaml", nil, 30*time.Second); err != nil {
					t.Error(err)
				}
			}()
			// The daemon wrote the policy before it logged it loaded.
			s.expectStoppedWithin(t, 50*time.Millisecond)
			if got := revoked() - revokedBefore; got < 1 {
				t.Errorf("no drop counted as policy-revoked on %s", tc.on.Name)
			}
		})
	}
}
