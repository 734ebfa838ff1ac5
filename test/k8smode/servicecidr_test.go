package k8smode

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
	"github.com/coordino/coordino/test/harness"
)

// status asks node's daemon for its status.
func status(t *testing.T, node *k8sNode) *inspectv1.Status {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(node.RunDir, "inspect.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := inspectv1.NewInspectorClient(conn).GetStatus(ctx, &inspectv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitRanges waits until the daemon's Service ranges and NAT-exempt pools
// are want and exempt, and its post-DNAT map holds as many ranges.
func waitRanges(t *testing.T, node *k8sNode, want, exempt []string) {
	t.Helper()
	var last string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		m := status(t, node).GetMasquerade()
		n, err := harness.PinnedMapEntries(filepath.Join(node.BPFDir, "cdo_svc_cidrs"))
		if err == nil && slices.Equal(m.GetServiceCidrs(), want) && slices.Equal(m.GetExempt(), exempt) && n == len(want) {
			return
		}
		last = fmt.Sprintf("Service ranges %v, exempt %v, post-DNAT map entries %d (%v)", m.GetServiceCidrs(), m.GetExempt(), n, err)
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("want Service ranges %v and exempt %v; daemon has %s\n%s", want, exempt, last, node.LogTail(20))
}

// TestServiceCIDRsFromAPI: with no --service-cidrs the daemon takes the
// Service ranges from the API's ServiceCIDR objects (the API server's
// default one, from its --service-cluster-ip-range) into its post-DNAT map
// and masquerade, follows a second one created live, and an IPPool with
// natOutgoing false is exempt from masquerade. The old daemon had no
// Service range without the flag.
func TestServiceCIDRsFromAPI(t *testing.T) {
	_, c, _, node := setup(t, "10.63.0.0/26")
	c.node(t, node)
	if err := node.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	waitRanges(t, node, []string{serviceCIDR}, nil)

	ctx := context.Background()
	extra := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra-" + harness.RandomSuffix(6)},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.200.0.0/16", "fd00:200::/112"}}}
	if _, err := c.kube.NetworkingV1().ServiceCIDRs().Create(ctx, extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	no := false
	pool := &coordinov1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "routed-" + harness.RandomSuffix(6)},
		Spec: coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.70.0.0/16"}, NatOutgoing: &no}}
	if _, err := c.crd.CoordinoV1alpha1().IPPools().Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRanges(t, node, []string{"10.200.0.0/16", serviceCIDR, "fd00:200::/112"}, []string{"10.70.0.0/16"})
}
