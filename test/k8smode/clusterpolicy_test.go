package k8smode

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	"github.com/coordino/coordino/test/harness"
)

// TestKubernetesClusterNetworkPolicy: a ClusterNetworkPolicy created in the
// API server (its CRD installed from api/crds) reaches the daemon's
// datapath: an Admin Deny cuts the client off the server where no
// NetworkPolicy isolates it, a Pass at a higher precedence hands the
// decision back (allowed again), deleting the Pass denies again and
// deleting the Deny restores the default.
func TestKubernetesClusterNetworkPolicy(t *testing.T) {
	_, c, ns, node := setup(t, "10.63.0.0/26")
	c.pod(t, ns, "server", node.Name, serverLabels)
	c.pod(t, ns, "client", node.Name, clientLabels)
	if err := node.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	server, client := node.add(t, ns, "server"), node.add(t, ns, "client")
	stop, err := harness.ServeTCPEcho(server.NS, server.addr, port)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	expectPorts(t, "no policy", client, server, map[int]harness.Outcome{port: harness.Reached})

	cnps := cnpclient.NewForConfigOrDie(c.cfg).PolicyV1beta1().ClusterNetworkPolicies()
	subject := cnpv1beta1.ClusterNetworkPolicySubject{Pods: &cnpv1beta1.NamespacedPod{
		NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
		PodSelector:       metav1.LabelSelector{MatchLabels: serverLabels}}}
	from := []cnpv1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}}
	deny := &cnpv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-" + ns},
		Spec: cnpv1beta1.ClusterNetworkPolicySpec{Tier: cnpv1beta1.AdminTier, Priority: 20, Subject: subject,
			Ingress: []cnpv1beta1.ClusterNetworkPolicyIngressRule{{Action: cnpv1beta1.ClusterNetworkPolicyRuleActionDeny, From: from}}}}
	if _, err := cnps.Create(bg(t), deny, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cnps.Delete(bg(t), deny.Name, metav1.DeleteOptions{}) })
	expectPorts(t, "admin deny", client, server, map[int]harness.Outcome{port: harness.Blocked})

	pass := deny.DeepCopy()
	pass.Name, pass.Spec.Priority = "pass-"+ns, 10
	pass.Spec.Ingress[0].Action = cnpv1beta1.ClusterNetworkPolicyRuleActionPass
	if _, err := cnps.Create(bg(t), pass, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cnps.Delete(bg(t), pass.Name, metav1.DeleteOptions{}) })
	expectPorts(t, "pass before the deny", client, server, map[int]harness.Outcome{port: harness.Reached})

	if err := cnps.Delete(bg(t), pass.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expectPorts(t, "pass deleted", client, server, map[int]harness.Outcome{port: harness.Blocked})
	if err := cnps.Delete(bg(t), deny.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expectPorts(t, "deny deleted", client, server, map[int]harness.Outcome{port: harness.Reached})
}

// TestKubernetesClusterPolicyByPodName: a ClusterNetworkPolicy that picks
// one StatefulSet pod by statefulset.kubernetes.io/pod-name (a label left
// out of identities while no policy names it), as the upstream conformance
// suite does, is enforced on that pod alone: the daemon moves the pods
// carrying the label to label sets with it when the policy appears, and
// back when it goes. Before, the subject never matched and both replicas
// stayed open.
func TestKubernetesClusterPolicyByPodName(t *testing.T) {
	_, c, ns, node := setup(t, "10.63.1.0/26")
	const key = "statefulset.kubernetes.io/pod-name"
	web := func(name string) map[string]string { return map[string]string{"app": "web", key: name} }
	c.pod(t, ns, "web-0", node.Name, web("web-0"))
	c.pod(t, ns, "web-1", node.Name, web("web-1"))
	c.pod(t, ns, "client", node.Name, clientLabels)
	if err := node.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	web0, web1, client := node.add(t, ns, "web-0"), node.add(t, ns, "web-1"), node.add(t, ns, "client")
	for _, p := range []*podIn{web0, web1} {
		stop, err := harness.ServeTCPEcho(p.NS, p.addr, port)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
	}
	eventually(t, 5*time.Second, "the replicas share one label set", node.metricIs(t, "coordino_identities_temporary", 2))
	expectPorts(t, "no policy: web-0", client, web0, map[int]harness.Outcome{port: harness.Reached})

	cnps := cnpclient.NewForConfigOrDie(c.cfg).PolicyV1beta1().ClusterNetworkPolicies()
	deny := &cnpv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-web-0-" + ns},
		Spec: cnpv1beta1.ClusterNetworkPolicySpec{Tier: cnpv1beta1.AdminTier, Priority: 20,
			Subject: cnpv1beta1.ClusterNetworkPolicySubject{Pods: &cnpv1beta1.NamespacedPod{
				NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
				PodSelector:       metav1.LabelSelector{MatchLabels: map[string]string{key: "web-0"}}}},
			Ingress: []cnpv1beta1.ClusterNetworkPolicyIngressRule{{Action: cnpv1beta1.ClusterNetworkPolicyRuleActionDeny,
				From: []cnpv1beta1.ClusterNetworkPolicyIngressPeer{{Namespaces: &metav1.LabelSelector{}}}}}}}
	if _, err := cnps.Create(bg(t), deny, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cnps.Delete(bg(t), deny.Name, metav1.DeleteOptions{}) })
	expectPorts(t, "deny by pod name: web-0", client, web0, map[int]harness.Outcome{port: harness.Blocked})
	expectPorts(t, "deny by pod name: web-1", client, web1, map[int]harness.Outcome{port: harness.Reached})
	eventually(t, 5*time.Second, "a label set per replica", node.metricIs(t, "coordino_identities_temporary", 3))

	if err := cnps.Delete(bg(t), deny.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expectPorts(t, "policy gone: web-0", client, web0, map[int]harness.Outcome{port: harness.Reached})
	eventually(t, 5*time.Second, "the replicas share one label set again", node.metricIs(t, "coordino_identities_temporary", 2))
}
