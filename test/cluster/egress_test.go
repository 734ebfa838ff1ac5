//go:build linux && clustere2e

package cluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/coordino/coordino/test/testbed"
)

// outsidePort is what the outside host serves (TCP).
const outsidePort = 9090

// extraServiceCIDR is the ServiceCIDR the test adds while the bed runs.
var extraServiceCIDR = netip.MustParsePrefix("10.113.0.0/24")

// TestClusterEgress (make e2e-cluster-egress): the bed's Service range is
// not the default one and Coordino takes it from the API (no range in the
// DaemonSet); a ServiceCIDR added live is decided on the backend at once; a
// node address on a NodePort is decided on the backend (an allow for the
// node address does not reach it); pods on every worker reach the outside
// host, which sees each worker's address (masquerade) and has no route to
// the pod ranges.
func TestClusterEgress(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	dir := t.TempDir() + "/c"
	start := time.Now()
	c, err := Up(ctx, Options{Dir: dir, Workers: 2, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster up in %s", time.Since(start).Round(time.Second))
	defer func() {
		if err := c.Down(); err != nil {
			t.Errorf("down: %v", err)
		}
	}()
	start = time.Now()
	defer func() { t.Logf("egress checks in %s", time.Since(start).Round(time.Second)) }()

	// The range is the API server's, read back from the API; the DaemonSet
	// names none.
	sc, err := c.Client.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the API's default ServiceCIDR: %v", err)
	}
	if !slices.Contains(sc.Spec.CIDRs, ServiceCIDR) {
		t.Fatalf("default ServiceCIDR %v, want the bed's %s", sc.Spec.CIDRs, ServiceCIDR)
	}
	ds, err := c.Client.AppsV1().DaemonSets("coordino-system").Get(ctx, "coordino", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ctr := range ds.Spec.Template.Spec.Containers {
		for _, a := range append(ctr.Command, ctr.Args...) {
			if strings.HasPrefix(a, "--service-cidrs") {
				t.Errorf("the DaemonSet hard-codes a Service range: %s %q", ctr.Name, a)
			}
		}
	}

	peers := serveOutside(t, c)
	ns := "egress"
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Server(ctx, ns, "server", c.Nodes[0], map[string]string{"app": "server"}); err != nil {
		t.Fatal(err)
	}
	connect := func(name, node, addr string, labels map[string]string) bool {
		t.Helper()
		ok, err := c.Connect(ctx, ns, name, node, addr, labels)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	outside := net.JoinHostPort(OutsideIP.String(), fmt.Sprint(outsidePort))

	// Every worker's pods reach the outside host, as the worker.
	for i, node := range c.Nodes {
		if !connect("out-"+node, node, outside, nil) {
			t.Errorf("a pod on %s cannot reach the outside host %s", node, outside)
			continue
		}
		select {
		case got := <-peers:
			if got != c.workerIP(i+1) {
				t.Errorf("the outside host saw a pod on %s as %s, want the node's %s", node, got, c.workerIP(i+1))
			}
		case <-time.After(10 * time.Second):
			t.Errorf("the outside host recorded no connection from %s", node)
		}
	}

	// Services: one in the bed's range, one NodePort.
	svc := func(name string, typ corev1.ServiceType, clusterIP string) *corev1.Service {
		t.Helper()
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.ServiceSpec{
			Type: typ, ClusterIP: clusterIP, Selector: map[string]string{"app": "server"},
			Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(ServerPort)}},
		}}
		s, err := c.Client.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("Service %s: %v", name, err)
		}
		return s
	}
	clusterIP := svc("web", corev1.ServiceTypeClusterIP, "")
	if !netip.MustParsePrefix(ServiceCIDR).Contains(netip.MustParseAddr(clusterIP.Spec.ClusterIP)) {
		t.Errorf("ClusterIP %s outside the bed's range %s", clusterIP.Spec.ClusterIP, ServiceCIDR)
	}
	nodePort := svc("web-np", corev1.ServiceTypeNodePort, "")
	np := nodePort.Spec.Ports[0].NodePort

	// Clients may open flows to the server pods on its port, nothing else.
	egressTo := func(name, app string, to networkingv1.NetworkPolicyPeer) {
		t.Helper()
		p := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{to}}},
			},
		}
		if _, err := c.Client.NetworkingV1().NetworkPolicies(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	client := map[string]string{"app": "client"}
	egressTo("client", "client", networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}}})
	// Enforced on every worker before anything is judged: the outside
	// host is not among the client's peers.
	for _, node := range c.Nodes {
		denied := false
		for i := 0; i < 8 && !denied; i++ {
			denied = !connect(fmt.Sprintf("wait-%s-%d", node, i), node, outside, client)
		}
		if !denied {
			t.Fatalf("the client's egress policy is not enforced on %s: it still reaches the outside host", node)
		}
	}
	for _, node := range c.Nodes {
		if !connect("cip-"+node, node, net.JoinHostPort(clusterIP.Spec.ClusterIP, "80"), client) {
			t.Errorf("client on %s denied to ClusterIP %s (the backend is allowed; judged on the ClusterIP?)", node, clusterIP.Spec.ClusterIP)
		}
		nodeIP, _ := c.NodeIP(node)
		if !connect("np-"+node, node, net.JoinHostPort(nodeIP.String(), fmt.Sprint(np)), client) {
			t.Errorf("client on %s denied to its node's NodePort %s:%d (the backend is allowed; judged on the node address?)", node, nodeIP, np)
		}
	}

	// A ServiceCIDR added live: a Service in it is decided on the backend.
	extra := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{extraServiceCIDR.String()}}}
	if _, err := c.Client.NetworkingV1().ServiceCIDRs().Create(ctx, extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = testbed.WaitFor(ctx, "ServiceCIDR extra ready", time.Minute, func() error {
		got, err := c.Client.NetworkingV1().ServiceCIDRs().Get(ctx, "extra", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == networkingv1.ServiceCIDRConditionReady && cond.Status == metav1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %v", got.Status.Conditions)
	})
	if err != nil {
		t.Fatal(err)
	}
	extraIP := extraServiceCIDR.Addr().Next().Next().String()
	svc("web-extra", corev1.ServiceTypeClusterIP, extraIP)
	for _, node := range c.Nodes {
		ok := false
		for i := 0; i < 4 && !ok; i++ {
			ok = connect(fmt.Sprintf("extra-%s-%d", node, i), node, net.JoinHostPort(extraIP, "80"), client)
		}
		if !ok {
			t.Errorf("client on %s denied to %s in the ServiceCIDR added live (judged on the address?)", node, extraIP)
		}
	}

	// Allowing the node address does not open the backend behind its
	// NodePort: that is decided on the backend.
	nodeOnly := map[string]string{"app": "node-only"}
	for _, node := range c.Nodes {
		nodeIP, _ := c.NodeIP(node)
		name := "node-only-" + node
		egressTo(name, "node-only", networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: nodeIP.String() + "/32"}})
		denied := false
		for i := 0; i < 6 && !denied; i++ {
			denied = !connect(fmt.Sprintf("%s-%d", name, i), node, net.JoinHostPort(nodeIP.String(), fmt.Sprint(np)), nodeOnly)
		}
		if !denied {
			t.Errorf("a pod on %s allowed only its node's address reaches the backend behind NodePort %d", node, np)
		}
		if err := c.Client.NetworkingV1().NetworkPolicies(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// serveOutside accepts TCP connections on the outside host and sends each
// peer's address; it has no route to the pod ranges, so a pod's own
// address could not be answered.
func serveOutside(t *testing.T, c *Cluster) <-chan netip.Addr {
	t.Helper()
	var ln net.Listener
	err := c.InOutside(func() error {
		var err error
		ln, err = net.Listen("tcp4", net.JoinHostPort(OutsideIP.String(), fmt.Sprint(outsidePort)))
		return err
	})
	if err != nil {
		t.Fatalf("outside host: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	peers := make(chan netip.Addr, 64)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			if ap, err := netip.ParseAddrPort(conn.RemoteAddr().String()); err == nil {
				select {
				case peers <- ap.Addr().Unmap():
				default:
				}
			}
			conn.Close()
		}
	}()
	return peers
}
