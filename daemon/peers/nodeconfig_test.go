package peers

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coordino/coordino/api/client/clientset/versioned/fake"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

func nodeConfig(name string, addrs []string, blocks ...string) *coordinov1alpha1.NodeConfig {
	nc := &coordinov1alpha1.NodeConfig{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, b := range blocks {
		nc.Spec.Blocks = append(nc.Spec.Blocks, coordinov1alpha1.NodeBlock{CIDR: b, Pool: "default"})
	}
	nc.Status.Addresses = addrs
	return nc
}

func TestFromNodeConfigsSkipsBadAndOverlapping(t *testing.T) {
	good := nodeConfig("a", []string{"192.0.2.1", "2001:db8::1"}, "10.1.0.0/24", "fd00:1::/64")
	good.Spec.Blocks[0].Releasing = true
	good.Status.WireGuard = &coordinov1alpha1.WireGuardStatus{PublicKey: key, Endpoint: "192.0.2.1:51871"}
	set := FromNodeConfigs([]*coordinov1alpha1.NodeConfig{
		good,
		nodeConfig("b", []string{"not-an-ip"}, "10.2.0.0/24"),
		nodeConfig("c", []string{"192.0.2.3"}, "10.0.0.0/8"), // covers a's block
		nodeConfig("d", []string{"192.0.2.4"}, "10.4.0.0/24"),
	}, zap.NewNop())
	if len(set) != 2 || set["a"] == nil || set["d"] == nil {
		t.Fatalf("want nodes a and d, got %v", set.Names())
	}
	a := set["a"]
	if len(a.Blocks) != 2 || a.WireGuard == nil || a.WireGuard.Endpoint != netip.MustParseAddrPort("192.0.2.1:51871") {
		t.Fatalf("node a: %+v (a releasing block stays routed)", a)
	}
}

// TestNodeConfigsSource drives the informer with a fake clientset: this is
// the conversion and event plumbing only; no API server is involved.
func TestNodeConfigsSource(t *testing.T) {
	client := fake.NewSimpleClientset(nodeConfig("a", []string{"192.0.2.1"}, "10.1.0.0/24"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sets := make(chan Set, 10)
	src := &NodeConfigs{Client: client, Log: zap.NewNop()}
	go func() { _ = src.Run(ctx, func(s Set) { sets <- s }) }()
	next := func() Set {
		select {
		case s := <-sets:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no peer set applied")
			return nil
		}
	}
	if s := next(); len(s) != 1 || s["a"] == nil {
		t.Fatalf("initial set %v", s.Names())
	}
	b := nodeConfig("b", []string{"192.0.2.2"}, "10.2.0.0/24")
	if _, err := client.CoordinoV1alpha1().NodeConfigs().Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if s := next(); len(s) != 2 {
		t.Fatalf("after b joined: %v", s.Names())
	}
	b.Status.WireGuard = &coordinov1alpha1.WireGuardStatus{PublicKey: key}
	if _, err := client.CoordinoV1alpha1().NodeConfigs().UpdateStatus(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if s := next(); s["b"] == nil || s["b"].WireGuard == nil || s["b"].WireGuard.PublicKey != key {
		t.Fatalf("b's key not picked up: %+v", s["b"])
	}
	if err := client.CoordinoV1alpha1().NodeConfigs().Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if s := next(); len(s) != 1 || s["b"] == nil {
		t.Fatalf("after a left: %v", s.Names())
	}
}
