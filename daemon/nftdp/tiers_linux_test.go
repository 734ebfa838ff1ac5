package nftdp

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
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

// TestNodeIsolationNamedNotEnforced: NodeIsolationPolicy is the eBPF
// datapath's; here every update names the policies as not enforced (the
// error is logged and counted), never leaves them out silently, and
// NetworkPolicy holds as without them.
func TestNodeIsolationNamedNotEnforced(t *testing.T) {
	c := newCluster(t, false)
	s := snapshotOf(t, serverFromClientsOn80)
	for _, name := range []string{"only-ssh", "deny-pods-to-host"} {
		s.NodeIsolation = append(s.NodeIsolation, &coordinov1alpha1.NodeIsolationPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}})
	}
	err := c.dp.UpdatePolicy(s)
	if err == nil || !strings.Contains(err.Error(), "NodeIsolationPolicy not enforced on this node: deny-pods-to-host, only-ssh") {
		t.Fatalf("UpdatePolicy: %v, want the node isolation policies named as not enforced", err)
	}
	if got := c.dp.NotEnforced(); !strings.Contains(got, "deny-pods-to-host, only-ssh") {
		t.Errorf("NotEnforced (status) = %q", got)
	}
	c.expect(true, "a>b tcp/80")
	c.expect(false, "c>b tcp/80")
	if err := c.dp.UpdatePolicy(snapshotOf(t, serverFromClientsOn80)); err != nil || c.dp.NotEnforced() != "" {
		t.Errorf("without them: %v, NotEnforced %q", err, c.dp.NotEnforced())
	}
}
