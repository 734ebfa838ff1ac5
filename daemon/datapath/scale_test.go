package datapath

import (
	"fmt"
	"testing"
	"time"

	"github.com/coordino/coordino/daemon/policy"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// chainPolicies are n policies in namespace default: p<i> selects
// app=svc-<i> and lets app=svc-<i+1> in on TCP 80.
func chainPolicies(n int) policy.Snapshot {
	var s policy.Snapshot
	port := intstr.FromInt32(80)
	for i := range n {
		s.Policies = append(s.Policies, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("p", i), Namespace: "default"},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprint("svc-", i)}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprint("svc-", i+1)}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
				}},
			},
		})
	}
	return s
}

// relabel detaches pod name and attaches it again with labels (a pod DEL
// and ADD on the same interface).
func (c *cluster) relabel(name string, labels map[string]string) time.Duration {
	c.t.Helper()
	ep := c.eps[name]
	if err := c.dp.DetachEndpoint(ep); err != nil {
		c.t.Fatalf("detach %s: %v", name, err)
	}
	ep.Labels = labels
	start := time.Now()
	if err := c.dp.AttachEndpoint(ep); err != nil {
		c.t.Fatalf("attach %s: %v", name, err)
	}
	c.eps[name] = ep
	return time.Since(start)
}

// TestTenThousandPoliciesChurn: with 10,000 policies loaded, pods come and
// go with new label sets and every verdict follows the one policy that
// applies; the policy map holds only what local pods need.
func TestTenThousandPoliciesChurn(t *testing.T) {
	c := newCluster(t, AttachTC)
	if err := c.dp.UpdatePolicy(chainPolicies(10000)); err != nil {
		t.Fatal(err)
	}
	var attach []time.Duration
	for round, k := range []int{17, 4242, 9998} {
		attach = append(attach, c.relabel("b", map[string]string{"app": fmt.Sprint("svc-", k)}))
		attach = append(attach, c.relabel("a", map[string]string{"app": fmt.Sprint("svc-", k+1), "round": fmt.Sprint(round)}))
		c.expect(true, "a>b tcp/80", "node>b tcp/81")
		c.expect(false, "a>b tcp/81", "c>b tcp/80", "ext>b tcp/80")
		// a moves on to a label set p<k> does not name: b closes to it.
		attach = append(attach, c.relabel("a", map[string]string{"app": fmt.Sprint("svc-", k+2)}))
		c.expect(false, "a>b tcp/80")
	}
	c.dp.mu.Lock()
	entries := len(c.dp.mw.mirror.policy)
	c.dp.mu.Unlock()
	// b's one allow (from a's label set if it matches) and a's: at most a
	// few entries, not one per policy.
	if entries > 4 {
		t.Errorf("policy map holds %d entries with 3 local pods, want at most 4", entries)
	}
	t.Logf("AttachEndpoint with 10,000 policies loaded: %v", attach)
}
