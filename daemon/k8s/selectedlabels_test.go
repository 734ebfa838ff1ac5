package k8s

import (
	"testing"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// TestPodLabelsKeepSelectedLabels: a pod's security labels (what ADD and
// the refresh give its endpoint) leave statefulset.kubernetes.io/pod-name
// out until a ClusterNetworkPolicy or a PolicyIR selects on it, keep it
// while one does, and leave it out again after; only a change of the kept
// keys is reported (it is what moves the node's endpoints).
func TestPodLabelsKeepSelectedLabels(t *testing.T) {
	const key = "statefulset.kubernetes.io/pod-name"
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "sts", Name: "web-0", UID: "u0",
		Labels: map[string]string{"app": "web", key: "web-0", "controller-revision-hash": "r1"}}, Spec: corev1.PodSpec{NodeName: "n1"}}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sts"}}
	cnp := &cnpv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "one-pod"},
		Spec: cnpv1beta1.ClusterNetworkPolicySpec{Tier: cnpv1beta1.BaselineTier,
			Subject: cnpv1beta1.ClusterNetworkPolicySubject{Pods: &cnpv1beta1.NamespacedPod{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{key: "web-0"}}}}}}
	ir := &coordinov1alpha1.PolicyIR{ObjectMeta: metav1.ObjectMeta{Namespace: "sts", Name: "np"},
		Spec: coordinov1alpha1.PolicyIRSpec{Rules: []coordinov1alpha1.PolicyRule{{Direction: "Ingress",
			Peers: []coordinov1alpha1.PolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{key: "web-1"}}}}}}}}
	s := &Source{cfg: Config{NodeName: "n1", ExcludedLabels: coordinov1alpha1.DefaultExcludedLabels}, log: zap.NewNop()}
	step := func(what string, changed, kept bool, objs ...any) {
		t.Helper()
		s.setView(testLiveView(t, "n1", append(objs, pod, ns)...))
		if got := s.applyExcluded(snapshot(s.view())); got != changed {
			t.Errorf("%s: changed = %v, want %v", what, got, changed)
		}
		l, ok := s.podLabelsNow("sts", "web-0", "u0")
		if !ok {
			t.Fatalf("%s: pod unknown", what)
		}
		if _, has := l[key]; has != kept || l["app"] != "web" || l["controller-revision-hash"] != "" {
			t.Errorf("%s: security labels %v (want %s kept = %v)", what, l, key, kept)
		}
	}
	step("no policy", false, false)
	step("a ClusterNetworkPolicy subject names it", true, true, cnp)
	step("a PolicyIR peer names it too", false, true, cnp, ir)
	step("only the PolicyIR", false, true, ir)
	step("none", true, false)
}
