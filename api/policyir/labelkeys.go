package policyir

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// Identities leave per-pod labels out (coordinov1alpha1.DefaultExcludedLabels)
// so that replicas share one identity. A policy naming such a label (the
// upstream ClusterNetworkPolicy conformance tests pick single pods by
// statefulset.kubernetes.io/pod-name) could then never match, so an
// excluded key is kept while some policy's pod selector names it: only the
// pods carrying that key get identities of their own, and only for as long
// as the policy exists. The controller and the daemons derive the kept keys
// from the same objects (PolicyIRs and ClusterNetworkPolicies), so they
// agree on every pod's label set once both have seen them.

// PodLabelKeys calls add with every pod label key the selectors of a
// PolicyIR name: its subject's and its peers' (namespace selectors name
// namespace labels, which identities always keep).
func PodLabelKeys(spec *coordinov1alpha1.PolicyIRSpec, add func(string)) {
	selectorKeys(&spec.PodSelector, add)
	for _, r := range spec.Rules {
		for _, p := range r.Peers {
			selectorKeys(p.PodSelector, add)
		}
	}
}

// ClusterPodLabelKeys is PodLabelKeys for a ClusterNetworkPolicy.
func ClusterPodLabelKeys(cnp *cnpv1beta1.ClusterNetworkPolicy, add func(string)) {
	pods := func(p *cnpv1beta1.NamespacedPod) {
		if p != nil {
			selectorKeys(&p.PodSelector, add)
		}
	}
	pods(cnp.Spec.Subject.Pods)
	for _, r := range cnp.Spec.Ingress {
		for _, p := range r.From {
			pods(p.Pods)
		}
	}
	for _, r := range cnp.Spec.Egress {
		for _, p := range r.To {
			pods(p.Pods)
		}
	}
}

func selectorKeys(s *metav1.LabelSelector, add func(string)) {
	if s == nil {
		return
	}
	for k := range s.MatchLabels {
		add(k)
	}
	for _, e := range s.MatchExpressions {
		add(e.Key)
	}
}

// SelectedLabels counts, for each excluded label key, the policies whose
// pod selectors name it; Excluded is then the list identities leave out.
// A change costs the keys of the one policy changed. Not safe for
// concurrent use.
type SelectedLabels struct {
	excluded []string
	byPolicy map[string][]string // policy -> excluded keys it names
	refs     map[string]int
}

// NewSelectedLabels starts with no policy: every key of excluded is left out.
func NewSelectedLabels(excluded []string) *SelectedLabels {
	return &SelectedLabels{excluded: slices.Clone(excluded), byPolicy: map[string][]string{}, refs: map[string]int{}}
}

// PolicyIRKey and ClusterPolicyKey name a policy in Set.
func PolicyIRKey(namespace, name string) string { return "PolicyIR/" + namespace + "/" + name }

// ClusterPolicyKey names a ClusterNetworkPolicy in Set.
func ClusterPolicyKey(name string) string { return "ClusterNetworkPolicy/" + name }

// Set records the pod label keys a policy's selectors name (names yields
// them; nil for a deleted policy) and returns the excluded keys that
// became kept or excluded again by it.
func (s *SelectedLabels) Set(policy string, names func(add func(string))) []string {
	var keys []string
	if names != nil {
		names(func(k string) {
			if slices.Contains(s.excluded, k) && !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		})
	}
	old := s.byPolicy[policy]
	if len(keys) == 0 {
		delete(s.byPolicy, policy)
	} else {
		s.byPolicy[policy] = keys
	}
	var changed []string
	for _, k := range old {
		if s.refs[k]--; s.refs[k] == 0 {
			delete(s.refs, k)
			changed = append(changed, k)
		}
	}
	for _, k := range keys {
		if s.refs[k]++; s.refs[k] == 1 {
			if i := slices.Index(changed, k); i >= 0 {
				changed = slices.Delete(changed, i, i+1) // kept before and after
			} else {
				changed = append(changed, k)
			}
		}
	}
	return changed
}

// Excluded returns the excluded keys no policy names, in the order given
// to NewSelectedLabels.
func (s *SelectedLabels) Excluded() []string {
	out := make([]string, 0, len(s.excluded))
	for _, k := range s.excluded {
		if s.refs[k] == 0 {
			out = append(out, k)
		}
	}
	return out
}
