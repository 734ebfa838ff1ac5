package policygen

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// AppsPerNamespace is how many apps (label app=app-<n>) each namespace runs.
const AppsPerNamespace = 10

// NamespaceName is the name of namespace ns.
func NamespaceName(ns int) string { return fmt.Sprintf("ns-%d", ns) }

// Namespace is namespace ns: 50 teams, three environments.
func Namespace(ns int) *corev1.Namespace {
	name := NamespaceName(ns)
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"kubernetes.io/metadata.name": name, "team": fmt.Sprintf("team-%d", ns%50), "env": []string{"prod", "staging", "dev"}[ns%3]}}}
}

// PodLabels are the security-relevant labels of a pod of app in a
// namespace: app, tier (even apps frontend, odd backend) and version.
func PodLabels(app int) map[string]string {
	return map[string]string{"app": fmt.Sprintf("app-%d", app), "tier": []string{"frontend", "backend"}[app%2],
		"version": fmt.Sprintf("v%d", app%3)}
}

// NamedPorts are the container ports pods of every app declare by name.
var NamedPorts = map[string]int32{"http": 8080, "metrics": 9090}

// NetworkPolicy is the i-th policy of namespace ns; i cycles through five
// shapes.
func NetworkPolicy(ns, i int) *networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := func(p intstr.IntOrString, proto *corev1.Protocol) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: proto, Port: &p}
	}
	app := fmt.Sprintf("app-%d", i%AppsPerNamespace)
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: NamespaceName(ns), Name: fmt.Sprintf("np-%d", i),
		UID: types.UID(fmt.Sprintf("uid-%d-%d", ns, i)), Generation: 1}}
	spec := &np.Spec
	switch i % 5 {
	case 0:
		spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	case 1:
		spec.PodSelector.MatchLabels = map[string]string{"app": app}
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", (i+1)%AppsPerNamespace)}}}},
			Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromInt32(8080), &tcp), port(intstr.FromInt32(8443), &tcp)},
		}}
	case 2:
		spec.PodSelector.MatchLabels = map[string]string{"app": app, "tier": "backend"}
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("team-%d", ns%50)}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "frontend"}}}},
			Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromString("http"), &tcp)},
		}}
	case 3:
		spec.PodSelector.MatchLabels = map[string]string{"app": app}
		spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		spec.Egress = []networkingv1.NetworkPolicyEgressRule{
			{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}}}},
				Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromString("dns"), &udp), port(intstr.FromString("dns-tcp"), &tcp)}},
			{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{fmt.Sprintf("10.%d.0.0/16", ns%256)}}}}},
		}
	default:
		spec.PodSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"frontend", "backend"}},
			{Key: "version", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"v0"}}}
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "app", Operator: metav1.LabelSelectorOpExists}}}}},
			Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromString("metrics"), &tcp)},
		}}
	}
	return np
}
