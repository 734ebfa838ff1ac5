package nodeiso

import (
	"testing"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func nip(name string, spec coordinov1alpha1.NodeIsolationPolicySpec) *coordinov1alpha1.NodeIsolationPolicy {
	return &coordinov1alpha1.NodeIsolationPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
}

// TestCompile checks isolation inference, scopes, ranges, the union of
// policies and the tunnel ports against the table the datapath matches.
func TestCompile(t *testing.T) {
	tcp := func(port, end int32, scope string) coordinov1alpha1.HostPortRule {
		return coordinov1alpha1.HostPortRule{Protocol: "TCP", Port: port, EndPort: end, Scope: scope}
	}
	rules, err := Compile([]*coordinov1alpha1.NodeIsolationPolicy{
		nip("a", coordinov1alpha1.NodeIsolationPolicySpec{PodToHost: []coordinov1alpha1.HostPortRule{
			tcp(53, 0, coordinov1alpha1.ScopeAllNodes), tcp(6443, 0, coordinov1alpha1.ScopeOwnNode),
			{Protocol: "ICMP", Scope: coordinov1alpha1.ScopeOtherNodes}}}),
		nip("b", coordinov1alpha1.NodeIsolationPolicySpec{NodeToNode: []coordinov1alpha1.HostPortRule{tcp(10250, 10259, "")}}),
	}, []uint16{51871})
	if err != nil {
		t.Fatal(err)
	}
	if !rules.PodToHost || !rules.NodeToNode {
		t.Fatalf("isolation %+v, want both directions", rules)
	}
	table := policy.Table{}
	for _, k := range rules.Keys {
		table[k] = struct{}{}
	}
	for _, tc := range []struct {
		local, remote identity.ID
		dir           policy.Direction
		proto         uint8
		port          uint16
		want          bool
	}{
		{LocalPod, identity.Host, policy.Egress, policy.ProtoTCP, 53, true},
		{LocalPod, identity.RemoteNode, policy.Egress, policy.ProtoTCP, 53, true},
		{LocalPod, identity.Host, policy.Egress, policy.ProtoUDP, 53, false},
		{LocalPod, identity.Host, policy.Egress, policy.ProtoTCP, 6443, true},
		{LocalPod, identity.RemoteNode, policy.Egress, policy.ProtoTCP, 6443, false},
		{LocalPod, identity.RemoteNode, policy.Egress, policy.ProtoICMP, 0, true},
		{LocalPod, identity.RemoteNode, policy.Egress, protoICMPv6, 0, true},
		{LocalPod, identity.Host, policy.Egress, policy.ProtoICMP, 0, false},
		{identity.Host, identity.RemoteNode, policy.Ingress, policy.ProtoTCP, 10250, true},
		{identity.Host, identity.RemoteNode, policy.Ingress, policy.ProtoTCP, 10259, true},
		{identity.Host, identity.RemoteNode, policy.Ingress, policy.ProtoTCP, 10260, false},
		{identity.Host, identity.RemoteNode, policy.Ingress, policy.ProtoUDP, 51871, true},
		{identity.Host, identity.RemoteNode, policy.Ingress, policy.ProtoTCP, 53, false},
	} {
		if got := table.Match(tc.local, tc.remote, tc.dir, tc.proto, tc.port); got != tc.want {
			t.Errorf("%v -> %v dir %v proto %d port %d: allowed %v, want %v", tc.local, tc.remote, tc.dir, tc.proto, tc.port, got, tc.want)
		}
	}
}

// TestCompileTypes: without policies nothing is isolated; a policy isolates
// pod -> host by default and node -> node only with rules or when listed.
func TestCompileTypes(t *testing.T) {
	for _, tc := range []struct {
		name           string
		pols           []*coordinov1alpha1.NodeIsolationPolicy
		podHost, nodes bool
	}{
		{"none", nil, false, false},
		{"empty", []*coordinov1alpha1.NodeIsolationPolicy{nip("e", coordinov1alpha1.NodeIsolationPolicySpec{})}, true, false},
		{"node-to-node only", []*coordinov1alpha1.NodeIsolationPolicy{nip("n", coordinov1alpha1.NodeIsolationPolicySpec{
			PolicyTypes: []string{coordinov1alpha1.PolicyTypeNodeToNode}})}, false, true},
	} {
		r, err := Compile(tc.pols, []uint16{8472})
		if err != nil {
			t.Fatal(err)
		}
		if r.PodToHost != tc.podHost || r.NodeToNode != tc.nodes {
			t.Errorf("%s: podToHost %v nodeToNode %v, want %v %v", tc.name, r.PodToHost, r.NodeToNode, tc.podHost, tc.nodes)
		}
		if !r.NodeToNode && len(r.Keys) != 0 {
			t.Errorf("%s: tunnel ports allowed while node-to-node is open: %v", tc.name, r.Keys)
		}
	}
}

// TestCompileSkipsInvalid: an invalid policy is reported, the valid ones
// still apply.
func TestCompileSkipsInvalid(t *testing.T) {
	r, err := Compile([]*coordinov1alpha1.NodeIsolationPolicy{
		nip("bad", coordinov1alpha1.NodeIsolationPolicySpec{PodToHost: []coordinov1alpha1.HostPortRule{{Protocol: "GRE"}}}),
		nip("good", coordinov1alpha1.NodeIsolationPolicySpec{}),
	}, nil)
	if err == nil || !r.PodToHost {
		t.Fatalf("err %v, isolation %+v: want the bad policy reported and the good one applied", err, r)
	}
}
