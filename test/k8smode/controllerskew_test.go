package k8smode

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/test/apiserver"
	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// TestControllerSkew: the controller of the previous release
// (PREVIOUS_RELEASE, hack/build-previous.sh) with a daemon of this tree,
// and this tree's controller with the previous daemon, as during a roll,
// against the real kube-apiserver with this tree's CRDs (a roll applies
// them first). In each pairing the controller gives a new Node a block of
// the IPPool, the daemon serves ADDs from it, the controller's Identities
// replace the daemon's temporary ones, and the NetworkPolicy the
// controller compiles is enforced (client reached, other blocked).
func TestControllerSkew(t *testing.T) {
	privileged.Require(t)
	if err := harness.RequireBinaries(); err != nil {
		t.Fatal(err)
	}
	prev := harness.PreviousRelease(t)
	current := filepath.Join(harness.BinDir(), "coordino-controller")
	for _, tc := range []struct {
		name, controller, daemon string
	}{
		{"previous-controller/current-daemon", filepath.Join(prev, "coordino-controller"), ""},
		{"current-controller/previous-daemon", current, filepath.Join(prev, "coordino-daemon")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each its own API server and node
			start := time.Now()
			c := newCluster(t, apiserver.Start(t).Config)
			c.namespace(t, "coordino-system", nil) // the identity allocator's ConfigMap
			startControllerBinary(t, c, tc.controller)
			const pool = "10.63.0.0/24"
			if _, err := c.crd.CoordinoV1alpha1().IPPools().Create(bg(t), &coordinov1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "skew"},
				Spec: coordinov1alpha1.IPPoolSpec{CIDRs: []string{pool}}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			ns := "skew-" + harness.RandomSuffix(6)
			c.namespace(t, ns, nsLabels)
			c.networkPolicy(t, serverIngress(ns)) // waits for the controller's PolicyIR
			node := newK8sNode(t, c)
			node.DaemonBinary = tc.daemon
			for name, l := range map[string]map[string]string{"server": serverLabels, "client": clientLabels, "other": otherLabels} {
				c.pod(t, ns, name, node.Name, l)
			}
			if _, err := c.kube.CoreV1().Nodes().Create(bg(t), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node.Name}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := node.StartDaemon(); err != nil {
				t.Fatal(err)
			}
			eventually(t, time.Minute, "an ADD served from the controller's block", func() (bool, string) {
				err := node.probeAdd(ns, "server")
				return err == nil, fmt.Sprint(err)
			})
			server, client, other := node.add(t, ns, "server"), node.add(t, ns, "client"), node.add(t, ns, "other")
			if !netip.MustParsePrefix(pool).Contains(server.addr) {
				t.Fatalf("server got %v, not from the IPPool %s", server.addr, pool)
			}
			eventually(t, 30*time.Second, "the controller's Identities for every pod", node.metricIs(t, "coordino_identities_temporary", 0))
			stop, err := harness.ServeTCPEcho(server.NS, server.addr, port)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			expect(t, tc.name, server, map[*podIn]harness.Outcome{client: harness.Reached, other: harness.Blocked})
			t.Logf("%s: block, ADDs, identities and policy in %s", tc.name, time.Since(start).Round(time.Millisecond))
		})
	}
}
