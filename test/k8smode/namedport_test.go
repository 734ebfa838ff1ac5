package k8smode

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/coordino/coordino/test/harness"
)

// podWithPorts creates a Pod object bound to node whose container declares
// the named TCP ports given.
func (c *cluster) podWithPorts(t testing.TB, ns, name, node string, labels map[string]string, ports map[string]int32) {
	t.Helper()
	no := false
	ctr := corev1.Container{Name: "c", Image: "example.invalid/pause"}
	for n, p := range ports {
		ctr.Ports = append(ctr.Ports, corev1.ContainerPort{Name: n, ContainerPort: p, Protocol: corev1.ProtocolTCP})
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: &no, Containers: []corev1.Container{ctr}},
	}
	if _, err := c.kube.CoreV1().Pods(ns).Create(bg(t), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// expectPorts waits (bounded) until TCP probes from `from` to each port of
// `to` give the wanted outcomes; policy reaches the daemon asynchronously.
func expectPorts(t *testing.T, what string, from, to *podIn, want map[int]harness.Outcome) {
	t.Helper()
	eventually(t, 10*time.Second, what, func() (bool, string) {
		var probes []harness.Probe
		var ports []int
		for p := range want {
			probes = append(probes, harness.Probe{From: from.NS, To: to.addr, Port: p, Proto: "tcp"})
			ports = append(ports, p)
		}
		got, err := harness.ProbeAll(probes, time.Second)
		if err != nil {
			return false, err.Error()
		}
		why, ok := "", true
		for i, p := range ports {
			why += fmt.Sprintf("%s→%s:%d %v (want %v); ", from.Name, to.Name, p, got[i], want[p])
			ok = ok && got[i] == want[p]
		}
		return ok, why
	})
}

func namedPort(name string) []networkingv1.NetworkPolicyPort {
	tcp := corev1.ProtocolTCP
	p := intstr.FromString(name)
	return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}}
}

// TestNamedPortsKubernetesMode: NetworkPolicies naming container ports,
// through the controller's PolicyIRs, enforced in the kernel with the ports
// the Pod objects declare. Ingress resolves against the selected pod's own
// ports, egress against the peer pod's; the port next to the named one
// stays denied. On the code before named-port resolution the named rules
// matched nothing, so the "named port allowed" probes were blocked.
func TestNamedPortsKubernetesMode(t *testing.T) {
	_, c, ns, node := setup(t, "10.62.0.0/26")
	c.podWithPorts(t, ns, "web", node.Name, map[string]string{"app": "web"}, map[string]int32{"http": 8080})
	c.podWithPorts(t, ns, "db", node.Name, map[string]string{"app": "db"}, map[string]int32{"pg": 5432})
	c.pod(t, ns, "client", node.Name, clientLabels)
	if err := node.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	web, db, client := node.add(t, ns, "web"), node.add(t, ns, "db"), node.add(t, ns, "client")
	for _, s := range []struct {
		pod   *podIn
		ports []int
	}{{web, []int{8080, 8081}}, {db, []int{5432, 5433}}} {
		for _, p := range s.ports {
			stop, err := harness.ServeTCPEcho(s.pod.NS, s.pod.addr, p)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
		}
	}
	expectPorts(t, "no policy", client, web, map[int]harness.Outcome{8080: harness.Reached, 8081: harness.Reached})

	c.networkPolicy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "web-http", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: namedPort("http"),
			}},
		},
	})
	expectPorts(t, "ingress on named port http", client, web, map[int]harness.Outcome{8080: harness.Reached, 8081: harness.Blocked})

	c.networkPolicy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "client-to-pg", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}},
				Ports: namedPort("pg"),
			}},
		},
	})
	expectPorts(t, "egress on the peer's named port pg", client, db, map[int]harness.Outcome{5432: harness.Reached, 5433: harness.Blocked})
	// The client's egress is now isolated: web's http is not a named port of db.
	expectPorts(t, "egress to a non-peer", client, web, map[int]harness.Outcome{8080: harness.Blocked})

	// A restarted daemon keeps resolving them (ports kept with the endpoint).
	if err := node.StopDaemon(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := node.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	expectPorts(t, "after a daemon restart", client, db, map[int]harness.Outcome{5432: harness.Reached, 5433: harness.Blocked})
}
