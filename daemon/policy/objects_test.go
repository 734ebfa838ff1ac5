package policy

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
)

// asPolicyIR is what a daemon receives in Kubernetes mode for np: the
// controller's compiled spec after a JSON round trip through the API.
func asPolicyIR(t *testing.T, np *networkingv1.NetworkPolicy) *coordinov1alpha1.PolicyIR {
	t.Helper()
	spec, err := policyir.Compile(np)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(&coordinov1alpha1.PolicyIR{ObjectMeta: metav1.ObjectMeta{Namespace: np.Namespace, Name: np.Name}, Spec: *spec})
	if err != nil {
		t.Fatal(err)
	}
	out := &coordinov1alpha1.PolicyIR{}
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPolicyIRCompilesLikeNetworkPolicy: random policies received as
// PolicyIRs through the API's JSON (Kubernetes mode) give the same rules,
// isolation and CIDR identities as the NetworkPolicies compiled by the
// daemon (standalone). The NetworkPolicy path itself, which goes through the
// same spec, is checked against the reference compiler in
// TestEngineMatchesReferenceCompiler.
func TestPolicyIRCompilesLikeNetworkPolicy(t *testing.T) {
	w := newWorld()
	for seed := range uint64(50) {
		fw := &fuzzWorld{rng: rand.New(rand.NewPCG(seed, 11))}
		byKey := map[string]*networkingv1.NetworkPolicy{}
		for range 6 {
			np := fw.policy()
			np.Namespace = fixtureNS[fw.rng.IntN(len(fixtureNS))]
			byKey[np.Namespace+"/"+np.Name] = np
		}
		var nps []*networkingv1.NetworkPolicy
		var irs []*coordinov1alpha1.PolicyIR
		for _, np := range byKey {
			nps = append(nps, np)
			irs = append(irs, asPolicyIR(t, np))
		}
		// One CIDR allocator: the same prefixes get the same identities.
		cidrs := identity.NewCIDRs()
		want, err := Compile(w.input(nps), cidrs)
		if err != nil {
			t.Fatal(err)
		}
		in := w.input(nil)
		in.PolicyIRs = irs
		got, err := Compile(in, cidrs)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.Rules, want.Rules) || !reflect.DeepEqual(got.Isolation, want.Isolation) ||
			!reflect.DeepEqual(got.CIDRs, want.CIDRs) || !reflect.DeepEqual(got.Warnings, want.Warnings) {
			t.Fatalf("seed %d: PolicyIR compiles differently:\n got %v %v %v\nwant %v %v %v", seed, got.Rules, got.CIDRs, got.Warnings, want.Rules, want.CIDRs, want.Warnings)
		}
	}
}

// TestPolicyIRNotValidSkipped: a PolicyIR the controller marked not Valid
// is reported with the controller's message and not applied.
func TestPolicyIRNotValidSkipped(t *testing.T) {
	w := newWorld()
	ir := asPolicyIR(t, mustPolicies(t, denyIngressA)[0])
	ir.Status.Conditions = []metav1.Condition{{Type: coordinov1alpha1.ConditionValid, Status: metav1.ConditionFalse, Reason: "InvalidNetworkPolicy", Message: "bad cidr"}}
	in := w.input(nil)
	in.PolicyIRs = []*coordinov1alpha1.PolicyIR{ir}
	res, err := Compile(in, identity.NewCIDRs())
	if err == nil || !strings.Contains(err.Error(), "bad cidr") {
		t.Fatalf("error = %v, want the controller's message", err)
	}
	if res.Isolation[w.ids["a/x"].ID] != 0 {
		t.Fatal("a PolicyIR marked not Valid was applied")
	}
}
