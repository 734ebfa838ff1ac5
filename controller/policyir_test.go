package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

func (e *env) policyIR(ns, name string) (*coordinov1alpha1.PolicyIR, error) {
	return e.crd.CoordinoV1alpha1().PolicyIRs(ns).Get(e.ctx, name, metav1.GetOptions{})
}

func mustNetworkPolicy(t *testing.T, doc string) *networkingv1.NetworkPolicy {
	t.Helper()
	np := &networkingv1.NetworkPolicy{}
	if err := yaml.Unmarshal([]byte(doc), np); err != nil {
		t.Fatal(err)
	}
	return np
}

// TestPolicyIRCompiler: the leader publishes one PolicyIR per NetworkPolicy
// with the compiled spec, owned by the policy and Valid; it follows
// updates and goes away with the policy.
func TestPolicyIRCompiler(t *testing.T) {
	e := newEnv(t)
	e.namespace("shop", nil)
	e.start(testOptions(), "policy-1")

	np := mustNetworkPolicy(t, `{metadata: {name: db, namespace: shop}, spec: {podSelector: {matchLabels: {app: db}},
  ingress: [{from: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: 5432}]}],
  egress: [{to: [{ipBlock: {cidr: 10.1.0.0/16, except: [10.1.5.0/24]}}]}]}}`)
	np, err := e.core.NetworkingV1().NetworkPolicies("shop").Create(e.ctx, np, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := coordinov1alpha1.PolicyIRSpec{
		PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
		PolicyTypes: []string{"Ingress", "Egress"},
		Rules: []coordinov1alpha1.PolicyRule{
			{Direction: "Ingress", Peers: []coordinov1alpha1.PolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}},
				Ports: []coordinov1alpha1.PolicyPortRange{{Protocol: 6, First: 5432, Last: 5432}}},
			{Direction: "Egress", Peers: []coordinov1alpha1.PolicyPeer{{IPBlock: &coordinov1alpha1.PolicyIPBlock{CIDR: "10.1.0.0/16", Except: []string{"10.1.5.0/24"}}}}},
		},
	}
	e.eventually("the PolicyIR", 30*time.Second, func() error {
		ir, err := e.policyIR("shop", "db")
		if err != nil {
			return err
		}
		if !equality.Semantic.DeepEqual(ir.Spec, want) {
			return fmt.Errorf("spec %+v, want %+v", ir.Spec, want)
		}
		if len(ir.OwnerReferences) != 1 || ir.OwnerReferences[0].UID != np.UID || ir.OwnerReferences[0].Kind != "NetworkPolicy" {
			return fmt.Errorf("owner references %+v", ir.OwnerReferences)
		}
		if c := apimeta.FindStatusCondition(ir.Status.Conditions, coordinov1alpha1.ConditionValid); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("conditions %+v", ir.Status.Conditions)
		}
		return nil
	})

	np.Spec.Ingress[0].Ports[0].Port = ptr(intstr.FromInt32(6432))
	if _, err := e.core.NetworkingV1().NetworkPolicies("shop").Update(e.ctx, np, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("the PolicyIR to follow the update", 30*time.Second, func() error {
		ir, err := e.policyIR("shop", "db")
		if err != nil {
			return err
		}
		if got := ir.Spec.Rules[0].Ports; len(got) != 1 || got[0].First != 6432 {
			return fmt.Errorf("ports %+v", got)
		}
		if ir.Status.ObservedGeneration != 2 {
			return fmt.Errorf("observedGeneration %d", ir.Status.ObservedGeneration)
		}
		return nil
	})

	if err := e.core.NetworkingV1().NetworkPolicies("shop").Delete(e.ctx, "db", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("the PolicyIR to go", 30*time.Second, func() error {
		if _, err := e.policyIR("shop", "db"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("get: %v", err)
		}
		return nil
	})
}

// TestPolicyIRInvalid: a NetworkPolicy the compiler rejects gets a Warning
// Event naming the field and a PolicyIR that isolates nothing with
// Valid=False. Today's API server rejects what Coordino rejects, so the
// invalid object reaches the compiler as one stored before validation
// tightened would: through its cache, with the writes going to the real
// API server.
func TestPolicyIRInvalid(t *testing.T) {
	e := newEnv(t)
	e.namespace("shop", nil)
	np, err := e.core.NetworkingV1().NetworkPolicies("shop").Create(e.ctx,
		mustNetworkPolicy(t, `{metadata: {name: old, namespace: shop}, spec: {podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8}}]}]}}`),
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stored := np.DeepCopy()
	stored.Spec.Egress[0].To[0].IPBlock.CIDR = "010.0.0.0/8"

	pc := NewPolicyCompiler(zaptest.NewLogger(t), e.core, e.crd, nil)
	pc.netpols = cache.NewIndexer(cache.MetaNamespaceKeyFunc, nil)
	pc.irs = cache.NewIndexer(cache.MetaNamespaceKeyFunc, nil)
	if err := pc.netpols.Add(stored); err != nil {
		t.Fatal(err)
	}
	ctx := e.ctx
	defer pc.ensureRecorder()()
	if err := pc.sync(ctx, "shop/old"); err != nil {
		t.Fatal(err)
	}
	ir, err := e.policyIR("shop", "old")
	if err != nil {
		t.Fatal(err)
	}
	c := apimeta.FindStatusCondition(ir.Status.Conditions, coordinov1alpha1.ConditionValid)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonInvalid || !strings.Contains(c.Message, "spec.egress[0].to[0].ipBlock.cidr") {
		t.Errorf("Valid condition %+v, want False naming spec.egress[0].to[0].ipBlock.cidr", c)
	}
	if len(ir.Spec.PolicyTypes) != 0 || len(ir.Spec.Rules) != 0 {
		t.Errorf("invalid policy's IR isolates: %+v", ir.Spec)
	}
	e.eventually("the Warning Event on the NetworkPolicy", 30*time.Second, func() error {
		evs, err := e.core.CoreV1().Events("shop").List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=old"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Type == corev1.EventTypeWarning && ev.Reason == ReasonInvalid && ev.InvolvedObject.Kind == "NetworkPolicy" &&
				ev.InvolvedObject.UID == np.UID && strings.Contains(ev.Message, "ipBlock.cidr") {
				return nil
			}
		}
		return fmt.Errorf("events %+v", evs.Items)
	})

	// Fixed: Valid again, with the compiled spec.
	if err := pc.irs.Add(ir); err != nil {
		t.Fatal(err)
	}
	if err := pc.netpols.Update(np); err != nil {
		t.Fatal(err)
	}
	if err := pc.sync(ctx, "shop/old"); err != nil {
		t.Fatal(err)
	}
	ir, err = e.policyIR("shop", "old")
	if err != nil {
		t.Fatal(err)
	}
	if c := apimeta.FindStatusCondition(ir.Status.Conditions, coordinov1alpha1.ConditionValid); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("after the fix: condition %+v", c)
	}
	if len(ir.Spec.Rules) != 1 || ir.Spec.Rules[0].Peers[0].IPBlock.CIDR != "10.0.0.0/8" {
		t.Errorf("after the fix: spec %+v", ir.Spec)
	}
}

func ptr[T any](v T) *T { return &v }
