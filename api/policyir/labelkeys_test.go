package policyir

import (
	"os"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

const podName = "statefulset.kubernetes.io/pod-name"

// TestSelectedLabels: an excluded key is kept from the first policy naming
// it in a pod selector (subject or peer, NetworkPolicy's PolicyIR or
// ClusterNetworkPolicy) to the last one's removal; a change reports only
// the keys whose state moved; keys identities keep anyway and namespace
// selectors never count.
func TestSelectedLabels(t *testing.T) {
	s := NewSelectedLabels(coordinov1alpha1.DefaultExcludedLabels)
	if got := s.Excluded(); !slices.Equal(got, coordinov1alpha1.DefaultExcludedLabels) {
		t.Fatalf("no policy: excluded %v", got)
	}
	set := func(key string, names func(func(string)), want ...string) {
		t.Helper()
		if got := s.Set(key, names); !slices.Equal(got, want) {
			t.Errorf("Set(%s) changed %v, want %v", key, got, want)
		}
	}
	kept := func(want bool) {
		t.Helper()
		if got := !slices.Contains(s.Excluded(), podName); got != want {
			t.Errorf("%s kept = %v, want %v (excluded %v)", podName, got, want, s.Excluded())
		}
	}
	cnp := parseCluster(t, `metadata: {name: one-pod}
spec:
  tier: Admin
  priority: 3
  subject: {namespaces: {matchLabels: {pod-template-hash: x}}}
  ingress:
  - action: Accept
    from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {statefulset.kubernetes.io/pod-name: web-0}}}}]`)
	clusterNames := func(add func(string)) { ClusterPodLabelKeys(cnp, add) }
	set(ClusterPolicyKey("one-pod"), clusterNames, podName)
	kept(true)
	if slices.Contains(s.Excluded(), "app") || !slices.Contains(s.Excluded(), "pod-template-hash") {
		t.Errorf("a namespace selector's key counted: %v", s.Excluded())
	}
	set(ClusterPolicyKey("one-pod"), clusterNames) // unchanged policy: nothing moves

	ir := &coordinov1alpha1.PolicyIRSpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
		Rules: []coordinov1alpha1.PolicyRule{{Direction: "Ingress", Peers: []coordinov1alpha1.PolicyPeer{{
			PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: podName, Operator: metav1.LabelSelectorOpIn, Values: []string{"web-1"}},
				{Key: "job-name", Operator: metav1.LabelSelectorOpExists}}}}}}}}
	irNames := func(add func(string)) { PodLabelKeys(ir, add) }
	set(PolicyIRKey("shop", "np"), irNames, "job-name") // pod-name already kept
	set(ClusterPolicyKey("one-pod"), nil)               // the PolicyIR still names it
	kept(true)
	set(PolicyIRKey("shop", "np"), nil, podName, "job-name")
	kept(false)
	if got := s.Excluded(); !slices.Equal(got, coordinov1alpha1.DefaultExcludedLabels) {
		t.Errorf("every policy gone: excluded %v", got)
	}
}

// TestPassAllManifest: the bed's pass-all ClusterNetworkPolicies
// (test/cluster/cnp-passall.yaml, E2E_CNP_PASSALL=1) normalize without
// warnings to Pass rules of every peer in both tiers.
func TestPassAllManifest(t *testing.T) {
	b, err := os.ReadFile("../../test/cluster/cnp-passall.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tiers []Tier
	for _, doc := range strings.Split(string(b), "\n---\n") {
		p, err := NormalizeCluster(parseCluster(t, doc))
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Warnings) > 0 || len(p.Rules) != 3 {
			t.Errorf("%s: rules %+v, warnings %v", p.Name, p.Rules, p.Warnings)
		}
		for _, r := range p.Rules {
			if r.Action != ActionPass || !r.AllTraffic() {
				t.Errorf("%s: rule %+v does not pass all traffic", p.Name, r)
			}
		}
		tiers = append(tiers, p.Tier)
	}
	if !slices.Equal(tiers, []Tier{TierAdmin, TierBaseline}) {
		t.Errorf("tiers %v", tiers)
	}
}
