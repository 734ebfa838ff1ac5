package k8smode

import (
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/test/harness"
)

// TestKubernetesNodeIsolation: a NodeIsolationPolicy created in the API
// server closes the node's ports to its pods except those it lists, and
// deleting it opens them again; the daemon watches the object. Both
// datapaths.
func TestKubernetesNodeIsolation(t *testing.T) {
	for _, dp := range []string{"ebpf", "nftables"} {
		t.Run(dp, func(t *testing.T) { checkKubernetesNodeIsolation(t, dp) })
	}
}

func checkKubernetesNodeIsolation(t *testing.T, datapath string) {
	_, c, ns, node := setup(t, "10.62.0.0/26")
	c.pod(t, ns, "client", node.Name, clientLabels)
	node.ExtraArgs = append(node.ExtraArgs, "--datapath", datapath)
	if err := node.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	client := node.add(t, ns, "client")
	nodeIP := netip.MustParseAddr("192.0.2.1")
	const open, closed = 53, 2222
	for _, port := range []int{open, closed} {
		stop, err := harness.Serve(node.NS, nodeIP, port, "node")
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
	}
	reaches := func(port int) bool {
		conn, err := harness.DialFrom(client.NS, "tcp", nodeIP, port, time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}
	if !reaches(closed) {
		t.Fatal("without a NodeIsolationPolicy the pod cannot reach its node")
	}
	nip := &coordinov1alpha1.NodeIsolationPolicy{ObjectMeta: metav1.ObjectMeta{Name: "dns-only"},
		Spec: coordinov1alpha1.NodeIsolationPolicySpec{PodToHost: []coordinov1alpha1.HostPortRule{
			{Protocol: "TCP", Port: open, Scope: coordinov1alpha1.ScopeOwnNode}}}}
	if _, err := c.crd.CoordinoV1alpha1().NodeIsolationPolicies().Create(bg(t), nip, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "node port closed to the pod", func() (bool, string) {
		return !reaches(closed), "still reachable"
	})
	if !reaches(open) {
		t.Error("the allowed port is not reachable")
	}
	if err := c.crd.CoordinoV1alpha1().NodeIsolationPolicies().Delete(bg(t), nip.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "node port open again", func() (bool, string) {
		return reaches(closed), "still closed"
	})
}
