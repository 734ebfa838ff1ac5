//go:build fabric

// Built with the fabric tag (make test-fabric): about 35 s with its API
// server, beyond what make test gives one scenario.

package multinode

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/coordino/coordino/test/harness"
)

// TestFabricBGPKubernetes: make test-fabric. The fabric with its nodes in
// Kubernetes mode (node0 and node1, one rack), for what only the API
// tells: Services to announce, and a Node deleted.
func TestFabricBGPKubernetes(t *testing.T) {
	f := newFabricWith(t, bgpMode, 2, 0, true)
	if err := f.waitRoutes(30*time.Second, f.nodes); err != nil {
		t.Fatal(err)
	}
	t.Run("service-addresses-announced", f.checkServiceAddresses)
	t.Run("node-deleted-leaves-at-once", f.checkNodeDeleted)
}

// routerNextHops is every valid path's next hop to dst in the router.
func (f *fabric) routerNextHops(dst string) ([]string, error) {
	tbl, err := f.routerTable(false)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range tbl[dst] {
		if r.Valid && len(r.Nexthops) > 0 {
			out = append(out, r.Nexthops[0].IP)
		}
	}
	slices.Sort(out)
	return out, nil
}

// waitNextHops waits until the router's paths to each prefix have exactly
// the next hops listed (none: no route).
func (f *fabric) waitNextHops(d time.Duration, want map[string][]string) error {
	return eventually(d, func() error {
		for dst, nhs := range want {
			got, err := f.routerNextHops(dst)
			if err != nil {
				return err
			}
			if !slices.Equal(got, nhs) {
				return fmt.Errorf("router: %s via %v, want %v", dst, got, nhs)
			}
		}
		return nil
	})
}

// checkServiceAddresses: the selected Services' externalIPs and
// load-balancer IPs reach the router as host routes, a Cluster Service's
// from both nodes, a Local one's only from the node with a ready endpoint
// and only while it is ready; an unselected Service's never; a deleted
// Service's are withdrawn.
func (f *fabric) checkServiceAddresses(t *testing.T) {
	ctx, k := bg(t), f.kube
	n0, n1 := f.nodes[0].fabricAddr(false).String(), f.nodes[1].fabricAddr(false).String()
	mk := func(name string, selected, local bool, externalIP string) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k.ns},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalIPs: []string{externalIP},
				Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(namePort), Protocol: corev1.ProtocolTCP}}}}
		if selected {
			s.Labels = map[string]string{announceLabel: "yes"}
		}
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		if local {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		out, err := k.kube.CoreV1().Services(k.ns).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create Service %s: %v", name, err)
		}
		return out
	}
	cl := mk("web-cluster", true, false, "192.0.2.10")
	cl.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "192.0.2.11"}}
	if _, err := k.kube.CoreV1().Services(k.ns).UpdateStatus(ctx, cl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mk("web-local", true, true, "192.0.2.20")
	mk("web-unselected", false, false, "192.0.2.30")
	// web-local's one endpoint runs on node1, as the EndpointSlice
	// controller would write it.
	ready := true
	node1 := f.nodes[1].Name
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-local-1", Namespace: k.ns, Labels: map[string]string{discoveryv1.LabelServiceName: "web-local"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{f.nodes[1].pods[0].addr(false).String()}, NodeName: &node1, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}}}
	es, err := k.kube.DiscoveryV1().EndpointSlices(k.ns).Create(ctx, es, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	both := []string{n0, n1}
	slices.Sort(both)
	if err := f.waitNextHops(15*time.Second, map[string][]string{
		"192.0.2.10/32": both, "192.0.2.11/32": both, "192.0.2.20/32": {n1}, "192.0.2.30/32": nil,
	}); err != nil {
		t.Fatalf("%v\n%s", err, logLines(f.nodes[1], "announcing", "withdrew", "Service addresses"))
	}
	t.Logf("Service addresses in the router %v after the objects were written", time.Since(start).Round(time.Millisecond))
	// The Local Service's endpoint turns not ready: its address goes.
	ready = false
	es.Endpoints[0].Conditions.Ready = &ready
	if _, err := k.kube.DiscoveryV1().EndpointSlices(k.ns).Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := k.kube.CoreV1().Services(k.ns).Delete(ctx, "web-cluster", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.waitNextHops(15*time.Second, map[string][]string{"192.0.2.10/32": nil, "192.0.2.11/32": nil, "192.0.2.20/32": nil}); err != nil {
		t.Fatal(err)
	}
}

// checkNodeDeleted deletes node1's Node while its daemon runs on: a node
// leaving, not restarting. Its speaker closes its session with a Cease, so
// the router withdraws its blocks at once (no stale routes for the restart
// time), node0's kernel drops them, and node1's kernel keeps no route it
// learned.
func (f *fabric) checkNodeDeleted(t *testing.T) {
	n0, n1 := f.nodes[0], f.nodes[1]
	if err := f.kube.kube.CoreV1().Nodes().Delete(bg(t), n1.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Well inside the hold time: only the Cease can make it.
	err := eventually(fabricHold/2, func() error {
		tbl, err := f.routerTable(false)
		if err != nil {
			return err
		}
		if rs := tbl[n1.blocks()[0].String()]; len(rs) > 0 {
			return fmt.Errorf("router still has %s: %+v", n1.blocks()[0], rs)
		}
		krs, err := kernelRoutes(n0)
		if err != nil {
			return err
		}
		if _, ok := krs[n1.blocks()[0]]; ok {
			return fmt.Errorf("node0 still routes %s", n1.blocks()[0])
		}
		if krs, err = kernelRoutes(n1); err != nil || len(krs) > 0 {
			return fmt.Errorf("node1 keeps %d learned routes (%v)", len(krs), err)
		}
		out, err := exec.Command(filepath.Join(harness.BinDir(), "coordinoctl"), "status", "--socket", filepath.Join(n1.RunDir, "inspect.sock")).CombinedOutput()
		if err != nil {
			return fmt.Errorf("coordinoctl status: %v: %s", err, out)
		}
		if regexp.MustCompile(`Established`).Match(out) {
			return fmt.Errorf("node1 still has an established session:\n%s", out)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v after %v", err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("node1 left the fabric %v after its Node was deleted (hold time %v, restart time %v)", time.Since(start).Round(time.Millisecond), fabricHold, fabricRestart)
	if !n1.LogContains("left the fabric") {
		t.Error("node1's log does not say it left the fabric")
	}
}
