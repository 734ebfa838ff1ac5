package k8smode

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
	"github.com/coordino/coordino/test/testbed"
)

// Services with the real kube-proxy: policy is decided on the backend
// kube-proxy's DNAT chose, and the backend's ingress sees the client.

const (
	svcBlock    = "10.62.0.0/26"
	serviceCIDR = "10.96.0.0/16" // the API server's --service-cluster-ip-range
	backendPort = 8080
)

// kubeProxy is the real kube-proxy in a node's netns.
type kubeProxy struct {
	proc *testbed.Proc
	bin  string
	node *k8sNode
}

// kubeProxyBinary is the test bed's kube-proxy build; the test is skipped
// without it (fails under CI=true, as the API server's tests do).
func kubeProxyBinary(t *testing.T) string {
	t.Helper()
	cache := os.Getenv("COORDINO_TESTBED_CACHE")
	if cache == "" {
		cache = "/var/cache/coordino-testbed"
	}
	bin := filepath.Join(cache, "kube-proxy-"+testbed.K8sVersion, "kube-proxy")
	if _, err := os.Stat(bin); err != nil {
		privileged.Needs(t, "%v: build it with test/testbed/build.sh kube-proxy", err)
	}
	return bin
}

// startKubeProxy runs kube-proxy (bin) in mode ("nftables" or "iptables")
// in the node's netns. --cluster-cidr makes it masquerade only traffic from
// outside the pod range, so pods keep their addresses towards backends.
func startKubeProxy(t *testing.T, bin string, node *k8sNode, mode string) *kubeProxy {
	t.Helper()
	kp := &kubeProxy{bin: bin, node: node, proc: &testbed.Proc{Name: "kube-proxy", Path: "nsenter",
		Args: []string{"--net=" + node.NS.Path(), "--", bin, "--kubeconfig", node.Kubeconfig,
			"--hostname-override", node.Name, "--proxy-mode", mode, "--cluster-cidr", svcBlock,
			// Leave the machine-wide conntrack table size alone.
			"--conntrack-max-per-core", "0", "--v", "2"},
		LogPath: filepath.Join(node.Dir, "kube-proxy-"+mode+".log")}}
	if err := kp.proc.Start(filepath.Join(node.Dir, "pids")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kp.stop(t) })
	return kp
}

// stop ends kube-proxy and removes its rules (kube-proxy --cleanup), so the
// next mode starts from an empty ruleset.
func (kp *kubeProxy) stop(t *testing.T) {
	if kp.proc == nil {
		return
	}
	if t.Failed() {
		if b, err := os.ReadFile(kp.proc.LogPath); err == nil {
			t.Logf("kube-proxy log tail:\n%s", tail(string(b), 30))
		}
	}
	_ = kp.proc.Stop(10 * time.Second)
	kp.proc = nil
	cleanup := &testbed.Proc{Name: "kube-proxy-cleanup", Path: "nsenter",
		Args:    []string{"--net=" + kp.node.NS.Path(), "--", kp.bin, "--cleanup"},
		LogPath: filepath.Join(kp.node.Dir, "kube-proxy-cleanup.log")}
	if err := cleanup.Start(filepath.Join(kp.node.Dir, "pids")); err == nil {
		deadline := time.Now().Add(20 * time.Second)
		for cleanup.Running() && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		_ = cleanup.Kill()
	}
}

func tail(s string, lines int) string {
	n := 0
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			n++
			if n > lines {
				return s[i+1:]
			}
		}
	}
	return s
}

// service creates a selector-less Service with one TCP and one UDP port
// (port → backendPort) and its EndpointSlice naming backend, as the
// EndpointSlice controller would; it returns the ClusterIP.
func (c *cluster) service(t *testing.T, ns, name string, port int32, backend *podIn, node string) netip.Addr {
	t.Helper()
	var ports []corev1.ServicePort
	var epPorts []discoveryv1.EndpointPort
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		pname := fmt.Sprintf("p-%s", map[corev1.Protocol]string{corev1.ProtocolTCP: "tcp", corev1.ProtocolUDP: "udp"}[proto])
		ports = append(ports, corev1.ServicePort{Name: pname, Protocol: proto, Port: port, TargetPort: intstr.FromInt32(backendPort)})
		p, bp := proto, int32(backendPort)
		epPorts = append(epPorts, discoveryv1.EndpointPort{Name: &pname, Protocol: &p, Port: &bp})
	}
	svc, err := c.kube.CoreV1().Services(ns).Create(bg(t), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: ports},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready := true
	_, err = c.kube.DiscoveryV1().EndpointSlices(ns).Create(bg(t), &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "coordino-test"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{backend.addr.String()}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports: epPorts,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return netip.MustParseAddr(svc.Spec.ClusterIP)
}

// exposeService makes Service name a LoadBalancer with an external IP and
// a load-balancer ingress IP.
func (c *cluster) exposeService(t *testing.T, ns, name string, external, lb netip.Addr) {
	t.Helper()
	svc, err := c.kube.CoreV1().Services(ns).Get(bg(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.ExternalIPs = []string{external.String()}
	// kube-proxy reads load-balancer IPs of LoadBalancer Services only.
	svc.Spec.Type = corev1.ServiceTypeLoadBalancer
	if svc, err = c.kube.CoreV1().Services(ns).Update(bg(t), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lb.String()}}
	if _, err := c.kube.CoreV1().Services(ns).UpdateStatus(bg(t), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// node creates the Node object kube-proxy reads its addresses from.
func (c *cluster) node(t *testing.T, n *k8sNode) {
	t.Helper()
	_, err := c.kube.CoreV1().Nodes().Create(bg(t), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.NodeIP.String()}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// svcProbe is one probe from a pod to a Service port.
type svcProbe struct {
	from  *podIn
	to    netip.Addr
	port  int
	proto string
	want  harness.Outcome
	what  string
}

// explainVerdict asks the node's inspect API (coordinoctl policy explain)
// about from → to:port/TCP and returns the verdict and the egress reason.
func explainVerdict(t *testing.T, node *k8sNode, from string, to netip.Addr, port uint32) (string, string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(node.RunDir, "inspect.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ex, err := inspectv1.NewInspectorClient(conn).ExplainPolicy(bg(t), &inspectv1.ExplainPolicyRequest{From: from, To: to.String(), Protocol: "TCP", Port: port})
	if err != nil {
		t.Fatalf("explain %s → %v:%d: %v", from, to, port, err)
	}
	return ex.Verdict, ex.Steps[0].Reason
}

func probeServices(t *testing.T, stage string, probes []svcProbe) {
	t.Helper()
	var ps []harness.Probe
	for _, p := range probes {
		ps = append(ps, harness.Probe{From: p.from.NS, To: p.to, Port: p.port, Proto: p.proto})
	}
	got, err := harness.ProbeAll(ps, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range probes {
		if got[i] != p.want {
			t.Errorf("%s: %s → %v:%d/%s (%s): %v, want %v", stage, p.from.Name, p.to, p.port, p.proto, p.what, got[i], p.want)
		}
	}
}

// servicePolicies: the client's egress allows pods role=backend on 8080
// (TCP, UDP) and the Service CIDR on port 81 only; backend's ingress allows
// only role=client.
func servicePolicies(ns string) []*networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	p8080, p81 := intstr.FromInt32(backendPort), intstr.FromInt32(81)
	sel := func(role string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"role": role}}
	}
	return []*networkingv1.NetworkPolicy{{
		ObjectMeta: metav1.ObjectMeta{Name: "client-egress", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *sel("client"),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("backend")}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p8080}, {Protocol: &udp, Port: &p8080}}},
				{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: serviceCIDR}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p81}}},
			},
		},
	}, {
		ObjectMeta: metav1.ObjectMeta{Name: "backend-ingress", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *sel("backend"),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("client")}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p8080}, {Protocol: &udp, Port: &p8080}}}},
		},
	}}
}

// TestServicesWithKubeProxy runs the real kube-proxy (nftables, then
// iptables mode) on a Kubernetes-mode node with Services and EndpointSlices
// in the real API server. Pods: client (role=client, egress-isolated),
// other (role=other, not isolated), backend (role=backend, ingress allows
// only role=client) and backend2 (role=backend2, no policy). Services:
// svc (port 80) → backend, svc2 (port 81) → backend2, TCP and UDP, target port 8080.
//
// On the datapath before post-DNAT decisions, client → svc:80 is blocked
// (the ClusterIP matched no rule) and client → svc2:81 reached (the
// ClusterIP matched the ipBlock rule although backend2 is not allowed):
// both assertions fail there.
func TestServicesWithKubeProxy(t *testing.T) {
	bin := kubeProxyBinary(t)
	_, c, ns, node := setup(t, svcBlock)
	node.ExtraArgs = append(node.ExtraArgs, "--service-cidrs", serviceCIDR)
	c.node(t, node)
	roles := map[string]string{"client": "client", "other": "other", "backend": "backend", "backend2": "backend2"}
	for name, role := range roles {
		c.pod(t, ns, name, node.Name, map[string]string{"role": role})
	}
	for _, np := range servicePolicies(ns) {
		c.networkPolicy(t, np)
	}
	if err := node.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	client, other := node.add(t, ns, "client"), node.add(t, ns, "other")
	backend, backend2 := node.add(t, ns, "backend"), node.add(t, ns, "backend2")
	for _, b := range []*podIn{backend, backend2} {
		stopTCP, err := harness.ServeTCPEcho(b.NS, b.addr, backendPort)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stopTCP)
		stopUDP, err := harness.ServeUDPEcho(b.NS, b.addr, backendPort)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stopUDP)
	}
	svc := c.service(t, ns, "svc", 80, backend, node.Name)
	svc2 := c.service(t, ns, "svc2", 81, backend2, node.Name)
	// svc's external IP and a load-balancer IP in its status: kube-proxy
	// translates both to backend, and client's egress is decided there.
	extIP, lbIP := netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.20")
	c.exposeService(t, ns, "svc", extIP, lbIP)
	// As a LoadBalancer, svc has node ports: the node's address on them is
	// decided on the backend too (the API's nodePorts and Node addresses).
	nodePorts := map[string]int{}
	if got, err := c.kube.CoreV1().Services(ns).Get(bg(t), "svc", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else {
		for _, p := range got.Spec.Ports {
			nodePorts[strings.ToLower(string(p.Protocol))] = int(p.NodePort)
		}
	}

	matrix := []svcProbe{
		{client, svc, 80, "tcp", harness.Reached, "egress allows the backend"},
		{client, svc, 80, "udp", harness.Reached, "egress allows the backend"},
		{client, svc2, 81, "tcp", harness.Blocked, "ipBlock allows the ClusterIP, not the backend"},
		{client, extIP, 80, "tcp", harness.Reached, "externalIP: egress allows the backend"},
		{client, lbIP, 80, "tcp", harness.Reached, "load-balancer IP: egress allows the backend"},
		{client, node.NodeIP, nodePorts["tcp"], "tcp", harness.Reached, "NodePort: egress allows the backend"},
		{client, node.NodeIP, nodePorts["udp"], "udp", harness.Reached, "NodePort: egress allows the backend"},
		{other, svc, 80, "tcp", harness.Blocked, "backend's ingress sees other, not the node"},
		{other, svc, 80, "udp", harness.Blocked, "backend's ingress sees other, not the node"},
		{other, svc2, 81, "tcp", harness.Reached, "nothing isolated"},
		{client, backend.addr, backendPort, "tcp", harness.Reached, "direct, as before"},
		{backend2, svc2, 81, "tcp", harness.Reached, "hairpin: its own Service, no policy"},
		{backend2, svc2, 81, "udp", harness.Reached, "hairpin: its own Service, no policy"},
	}
	for _, mode := range []string{"nftables", "iptables"} {
		t.Run(mode, func(t *testing.T) {
			start := time.Now()
			kp := startKubeProxy(t, bin, node, mode)
			// Programmed once the unrestricted path works.
			eventually(t, 60*time.Second, "kube-proxy ("+mode+") serves svc2", func() (bool, string) {
				got, err := harness.ProbeAll([]harness.Probe{{From: other.NS, To: svc2, Port: 81, Proto: "tcp"}}, time.Second)
				if err != nil {
					return false, err.Error()
				}
				return got[0] == harness.Reached, got[0].String()
			})
			t.Logf("kube-proxy %s programmed after %v", mode, time.Since(start).Round(time.Millisecond))
			probeServices(t, mode, matrix)
			kp.stop(t)
		})
	}
	// explain does not pretend to know the backend of a Service address.
	if v, _ := explainVerdict(t, node, ns+"/client", svc, 80); v != "decided-after-dnat" {
		t.Errorf("explain client → svc: verdict %q, want decided-after-dnat", v)
	}
	if v, _ := explainVerdict(t, node, ns+"/client", backend.addr, backendPort); v != "allowed" {
		t.Errorf("explain client → backend: verdict %q, want allowed", v)
	}
	if v, err := node.Metric("coordino_datapath_packets_total", `direction="egress"`, `reason="policy-denied"`); err != nil || v == 0 {
		t.Errorf("egress policy-denied counter = %v (%v), want > 0", v, err)
	}

	t.Run("fail closed without the post-DNAT hook", func(t *testing.T) {
		if err := node.StopDaemon(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		node.ExtraArgs = append(node.ExtraArgs, "--no-service-hook")
		if err := node.StartDaemon(); err != nil {
			t.Fatal(err)
		}
		if !node.LogContains("fail closed") {
			t.Error("daemon did not log that Service traffic fails closed")
		}
		startKubeProxy(t, bin, node, "nftables")
		eventually(t, 60*time.Second, "kube-proxy serves svc2", func() (bool, string) {
			got, err := harness.ProbeAll([]harness.Probe{{From: other.NS, To: svc2, Port: 81, Proto: "tcp"}}, time.Second)
			if err != nil {
				return false, err.Error()
			}
			return got[0] == harness.Reached, got[0].String()
		})
		probeServices(t, "no hook", []svcProbe{
			{client, svc, 80, "tcp", harness.Blocked, "cannot be decided: dropped"},
			{client, backend.addr, backendPort, "tcp", harness.Reached, "direct, as before"},
			{other, svc2, 81, "tcp", harness.Reached, "not egress-isolated"},
		})
		if v, r := explainVerdict(t, node, ns+"/client", svc, 80); v != "denied" || r != "service-unenforceable" {
			t.Errorf("explain client → svc without the hook: %q (%s), want denied (service-unenforceable)", v, r)
		}
		if v, err := node.Metric("coordino_datapath_packets_total", `reason="service-unenforceable"`); err != nil || v == 0 {
			t.Errorf("service-unenforceable counter = %v (%v), want > 0", v, err)
		}
	})
}
