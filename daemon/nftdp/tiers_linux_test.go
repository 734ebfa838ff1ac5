package nftdp

import (
	"strings"
	"testing"

	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"
)

// TestClusterPoliciesLeftOut: ClusterNetworkPolicy is the eBPF datapath's.
// Here its rules are left out, never read as allows (an Admin Accept lets
// nothing through that NetworkPolicy denies), NetworkPolicy holds as it
// would alone, and the update's error names every policy left out.
func TestClusterPoliciesLeftOut(t *testing.T) {
	c := newCluster(t, false)
	s := snapshotOf(t, policyDoc("server", "default", `  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 80}]
`))
	for _, doc := range []string{`
metadata: {name: accept-all}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {}}
  ingress: [{action: Accept, from: [{namespaces: {}}]}]`, `
metadata: {name: baseline-deny}
spec:
  tier: Baseline
  priority: 10
  subject: {namespaces: {}}
  egress: [{action: Deny, to: [{namespaces: {}}]}]`} {
		cnp := &cnpv1beta1.ClusterNetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(doc), cnp); err != nil {
			t.Fatal(err)
		}
		s.ClusterPolicies = append(s.ClusterPolicies, cnp)
	}
	err := c.dp.UpdatePolicy(s)
	if err == nil || !strings.Contains(err.Error(), "accept-all, baseline-deny") {
		t.Fatalf("UpdatePolicy: %v, want the cluster policies named as not enforced", err)
	}
	c.expect(true, "a>b tcp/80", "b>a tcp/80", "a>c tcp/81")
	c.expect(false, "a>b tcp/81", "c>b tcp/80", "ext>b tcp/80")
	if err := c.dp.UpdatePolicy(snapshotOf(t)); err != nil {
		t.Fatalf("without cluster policies: %v", err)
	}
	c.expect(true, "a>b tcp/81", "c>b tcp/80")
}
