package policy

import (
	"fmt"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apimeta "k8s.io/apimachinery/pkg/api/meta"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/api/policyir"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
)

// Object is one policy of a snapshot, whichever form it came in: a
// NetworkPolicy (standalone mode, compiled here) or a PolicyIR the
// controller compiled (Kubernetes mode).
type Object struct {
	// Key is "namespace/name".
	Key string
	// Source is the *networkingv1.NetworkPolicy or *coordinov1alpha1.PolicyIR.
	Source any
}

// Objects returns the snapshot's policies, NetworkPolicies first, then
// PolicyIRs, then ClusterNetworkPolicies (keyed "/name").
func (s Snapshot) Objects() []Object {
	out := make([]Object, 0, len(s.Policies)+len(s.PolicyIRs)+len(s.ClusterPolicies))
	for _, np := range s.Policies {
		out = append(out, Object{Key: np.Namespace + "/" + np.Name, Source: np})
	}
	for _, ir := range s.PolicyIRs {
		out = append(out, Object{Key: ir.Namespace + "/" + ir.Name, Source: ir})
	}
	for _, cnp := range s.ClusterPolicies {
		out = append(out, Object{Key: "/" + cnp.Name, Source: cnp})
	}
	return out
}

// Normalize validates the object and returns its IR.
func (o Object) Normalize() (*policyir.Policy, error) {
	switch src := o.Source.(type) {
	case *networkingv1.NetworkPolicy:
		return policyir.Normalize(src)
	case *coordinov1alpha1.PolicyIR:
		return policyir.FromObject(src)
	case *cnpv1beta1.ClusterNetworkPolicy:
		return policyir.NormalizeCluster(src)
	}
	return nil, fmt.Errorf("policy %s: unsupported object %T", o.Key, o.Source)
}

// Same reports whether o and p normalize alike: the same object, or equal
// specs (and, for a PolicyIR, the same Valid condition).
func (o Object) Same(p Object) bool {
	if o.Source == p.Source {
		return true
	}
	switch a := o.Source.(type) {
	case *networkingv1.NetworkPolicy:
		b, ok := p.Source.(*networkingv1.NetworkPolicy)
		return ok && equality.Semantic.DeepEqual(a.Spec, b.Spec)
	case *coordinov1alpha1.PolicyIR:
		b, ok := p.Source.(*coordinov1alpha1.PolicyIR)
		return ok && equality.Semantic.DeepEqual(a.Spec, b.Spec) && validity(a) == validity(b)
	case *cnpv1beta1.ClusterNetworkPolicy:
		b, ok := p.Source.(*cnpv1beta1.ClusterNetworkPolicy)
		return ok && equality.Semantic.DeepEqual(a.Spec, b.Spec)
	}
	return false
}

func validity(ir *coordinov1alpha1.PolicyIR) string {
	if c := apimeta.FindStatusCondition(ir.Status.Conditions, coordinov1alpha1.ConditionValid); c != nil {
		return string(c.Status) + ":" + c.Message
	}
	return ""
}

// Snapshot returns a snapshot holding only o.
func (o Object) Snapshot() Snapshot {
	switch src := o.Source.(type) {
	case *networkingv1.NetworkPolicy:
		return Snapshot{Policies: []*networkingv1.NetworkPolicy{src}}
	case *coordinov1alpha1.PolicyIR:
		return Snapshot{PolicyIRs: []*coordinov1alpha1.PolicyIR{src}}
	case *cnpv1beta1.ClusterNetworkPolicy:
		return Snapshot{ClusterPolicies: []*cnpv1beta1.ClusterNetworkPolicy{src}}
	}
	return Snapshot{}
}

// RulesOf splits o into one object per allow rule of dir, each named by
// its field ("spec.ingress[0]" for a NetworkPolicy, "spec.rules[2]" for a
// PolicyIR): what provenance compiles one at a time.
func (o Object) RulesOf(dir Direction) (fields []string, parts []Object) {
	switch src := o.Source.(type) {
	case *networkingv1.NetworkPolicy:
		n, field := len(src.Spec.Ingress), "ingress"
		if dir == Egress {
			n, field = len(src.Spec.Egress), "egress"
		}
		for i := range n {
			one := src.DeepCopy()
			if dir == Egress {
				one.Spec.Egress = one.Spec.Egress[i : i+1]
			} else {
				one.Spec.Ingress = one.Spec.Ingress[i : i+1]
			}
			fields = append(fields, fmt.Sprintf("spec.%s[%d]", field, i))
			parts = append(parts, Object{Key: o.Key, Source: one})
		}
	case *coordinov1alpha1.PolicyIR:
		want := "Ingress"
		if dir == Egress {
			want = "Egress"
		}
		for i, r := range src.Spec.Rules {
			if r.Direction != want {
				continue
			}
			one := src.DeepCopy()
			one.Spec.Rules = one.Spec.Rules[i : i+1]
			fields = append(fields, fmt.Sprintf("spec.rules[%d]", i))
			parts = append(parts, Object{Key: o.Key, Source: one})
		}
	}
	return fields, parts
}

// LeaveOutClusterPolicies removes s's ClusterNetworkPolicies, for a datapath
// that cannot enforce the tiers, and returns the error naming them (nil:
// there were none); why says which datapath, and why it cannot.
func LeaveOutClusterPolicies(s *Snapshot, why string) error {
	names := make([]string, len(s.ClusterPolicies))
	for i, c := range s.ClusterPolicies {
		names[i] = c.Name
	}
	s.ClusterPolicies = nil
	return notEnforced(why, "ClusterNetworkPolicy", names)
}

// notEnforced names the objects of kind a datapath left out.
func notEnforced(why, kind string, names []string) error {
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	return fmt.Errorf("%s: %s not enforced on this node: %s", why, kind, strings.Join(names, ", "))
}
