package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
	"sigs.k8s.io/yaml"
)

// TestClusterPolicyStatus runs against the real API server with the
// upstream CRD installed from api/crds: a valid ClusterNetworkPolicy gets
// Accepted=True, one the CRD schema lets through but the normalizer
// rejects (a selector operator the schema does not enumerate) gets
// Accepted=False naming the field and a Warning Event; fixing it accepts it.
func TestClusterPolicyStatus(t *testing.T) {
	e := newEnv(t)
	client := cnpclient.NewForConfigOrDie(e.s.Config)
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: e.core.CoreV1().Events("")})
	defer b.Shutdown()
	cs := NewClusterPolicyStatus(zaptest.NewLogger(t), client, newEventRecorder(b))
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- cs.Run(ctx, 1) }()
	defer func() { cancel(); <-done }()

	create := func(doc string) *cnpv1beta1.ClusterNetworkPolicy {
		t.Helper()
		cnp := &cnpv1beta1.ClusterNetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(doc), cnp); err != nil {
			t.Fatal(err)
		}
		out, err := client.PolicyV1beta1().ClusterNetworkPolicies().Create(e.ctx, cnp, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s: %v", cnp.Name, err)
		}
		return out
	}
	accepted := func(name string, want metav1.ConditionStatus, msg string) {
		t.Helper()
		e.eventually("Accepted="+string(want)+" on "+name, 30*time.Second, func() error {
			got, err := client.PolicyV1beta1().ClusterNetworkPolicies().Get(e.ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			c := apimeta.FindStatusCondition(got.Status.Conditions, ConditionAccepted)
			if c == nil || c.Status != want || !strings.Contains(c.Message, msg) || c.ObservedGeneration != got.Generation {
				return fmt.Errorf("condition %+v", c)
			}
			return nil
		})
	}
	create(`metadata: {name: deny-tenants}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {tenant: a}}}
  egress: [{action: Deny, to: [{namespaces: {matchLabels: {tenant: b}}}]}]`)
	accepted("deny-tenants", metav1.ConditionTrue, "enforced")

	bad := create(`metadata: {name: bad-selector}
spec:
  tier: Baseline
  priority: 3
  subject: {namespaces: {matchExpressions: [{key: tenant, operator: Bogus, values: [a]}]}}
  ingress: [{action: Deny, from: [{namespaces: {}}]}]`)
	accepted("bad-selector", metav1.ConditionFalse, "spec.subject.namespaces")
	e.eventually("the Warning Event on the ClusterNetworkPolicy", 30*time.Second, func() error {
		evs, err := e.core.CoreV1().Events("default").List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=bad-selector"})
		if err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.Type == corev1.EventTypeWarning && ev.Reason == ReasonClusterPolicyInvalid && ev.InvolvedObject.UID == bad.UID &&
				strings.Contains(ev.Message, "spec.subject.namespaces") {
				return nil
			}
		}
		return fmt.Errorf("events %+v", evs.Items)
	})

	// Fixed: accepted again.
	cur, err := client.PolicyV1beta1().ClusterNetworkPolicies().Get(e.ctx, "bad-selector", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Subject.Namespaces.MatchExpressions[0].Operator = metav1.LabelSelectorOpIn
	if _, err := client.PolicyV1beta1().ClusterNetworkPolicies().Update(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	accepted("bad-selector", metav1.ConditionTrue, "enforced")
}
