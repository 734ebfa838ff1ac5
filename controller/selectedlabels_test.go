package controller

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// TestIdentitiesKeepSelectedLabels: StatefulSet pods share one Identity
// while no policy names statefulset.kubernetes.io/pod-name; a
// ClusterNetworkPolicy selecting one pod by it (as the upstream
// conformance suite does) gives each pod carrying the label an Identity
// with it, and leaves other pods' Identities alone; a PolicyIR naming it
// keeps it after the cluster policy goes; with both gone the pods share
// one Identity again.
func TestIdentitiesKeepSelectedLabels(t *testing.T) {
	e := newEnv(t)
	e.namespace("sts", nil)
	e.start(testOptions(), "sel-1")
	cnps := cnpclient.NewForConfigOrDie(e.s.Config).PolicyV1beta1().ClusterNetworkPolicies()
	const key = "statefulset.kubernetes.io/pod-name"
	e.pod("sts", "web-0", "node-a", map[string]string{"app": "web", key: "web-0"})
	e.pod("sts", "web-1", "node-b", map[string]string{"app": "web", key: "web-1"})
	e.pod("sts", "db-0", "node-a", map[string]string{"app": "db"})
	set := func(extra map[string]string) map[string]string {
		out := map[string]string{coordinov1alpha1.NamespaceLabelPrefix + "kubernetes.io/metadata.name": "sts"}
		for k, v := range extra {
			out[k] = v
		}
		return out
	}
	shared, perPod := set(map[string]string{"app": "web"}), func(pod string) map[string]string {
		return set(map[string]string{"app": "web", key: pod})
	}
	expect := func(what string, want ...map[string]string) {
		t.Helper()
		e.eventually(what, 30*time.Second, func() error {
			ids, err := e.identities()
			if err != nil {
				return err
			}
			if len(ids) != len(want) {
				return fmt.Errorf("identities %v", ids)
			}
			for _, l := range want {
				if findIdentity(ids, "sts", l) == 0 {
					return fmt.Errorf("no identity for %v: %v", l, ids)
				}
			}
			return nil
		})
	}
	db := set(map[string]string{"app": "db"})
	expect("one Identity for both StatefulSet pods", shared, db)
	dbID := findIdentity(mustIdentities(t, e), "sts", db)

	cnp := &cnpv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "one-pod"},
		Spec: cnpv1beta1.ClusterNetworkPolicySpec{Tier: cnpv1beta1.AdminTier, Priority: 1,
			Subject: cnpv1beta1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}},
			Ingress: []cnpv1beta1.ClusterNetworkPolicyIngressRule{{Action: cnpv1beta1.ClusterNetworkPolicyRuleActionAccept,
				From: []cnpv1beta1.ClusterNetworkPolicyIngressPeer{{Pods: &cnpv1beta1.NamespacedPod{
					PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{key: "web-0"}}}}}}}}}
	if _, err := cnps.Create(e.ctx, cnp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("an Identity per StatefulSet pod, the shared one collected", perPod("web-0"), perPod("web-1"), db)
	if got := findIdentity(mustIdentities(t, e), "sts", db); got != dbID {
		t.Errorf("a pod without the label moved: identity %d, was %d", got, dbID)
	}

	ir := &coordinov1alpha1.PolicyIR{ObjectMeta: metav1.ObjectMeta{Namespace: "sts", Name: "np"},
		Spec: coordinov1alpha1.PolicyIRSpec{PolicyTypes: []string{"Ingress"},
			PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: key, Operator: metav1.LabelSelectorOpIn, Values: []string{"web-1"}}}}}}
	if _, err := e.crd.CoordinoV1alpha1().PolicyIRs("sts").Create(e.ctx, ir, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cnps.Delete(e.ctx, "one-pod", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.never("per-pod Identities lost while a PolicyIR still names the label", 2*time.Second, func() error {
		if ids, _ := e.identities(); findIdentity(ids, "sts", shared) != 0 {
			return nil
		}
		return fmt.Errorf("no")
	})
	if err := e.crd.CoordinoV1alpha1().PolicyIRs("sts").Delete(e.ctx, "np", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("one shared Identity again once no policy names the label", shared, db)
}
