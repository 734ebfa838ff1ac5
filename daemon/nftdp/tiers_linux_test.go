package nftdp

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/policy"
)

// withCluster adds ClusterNetworkPolicy documents (YAML) to s.
func withCluster(t testing.TB, s policy.Snapshot, docs ...string) policy.Snapshot {
	t.Helper()
	for _, doc := range docs {
		cnp := &cnpv1beta1.ClusterNetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(doc), cnp); err != nil {
			t.Fatal(err)
		}
		s.ClusterPolicies = append(s.ClusterPolicies, cnp)
	}
	return s
}

// tierChains lists the table's tier chains (dispatch and class).
func tierChains(t *testing.T) []string {
	t.Helper()
	conn, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ch := range chains {
		if _, _, ok := parseClassChain(ch.Name); ok || strings.HasPrefix(ch.Name, "ta-") || strings.HasPrefix(ch.Name, "tb-") {
			out = append(out, ch.Name)
		}
	}
	return out
}

// TestClusterPolicyTiers: the tiers in the order of the API over real
// traffic. An Admin Accept opens what NetworkPolicy closes and an Admin
// Deny closes what it opens; a Pass of a lower priority number hands the
// flow to NetworkPolicy ahead of an Accept; a Baseline Deny closes a pod
// no NetworkPolicy isolates and leaves an isolated one to NetworkPolicy.
// Denies are counted by tier; a restarted datapath adopts the tier maps
// and chains and keeps enforcing, and without cluster policies nothing of
// the tiers is left.
func TestClusterPolicyTiers(t *testing.T) {
	c := newCluster(t, false)
	s := withCluster(t, snapshotOf(t, policyDoc("server", "default", `  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 80}]
`)), `
metadata: {name: accept-other}
spec:
  tier: Admin
  priority: 5
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: server}}}}
  ingress:
  - action: Accept
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: other}}}]
    protocols: [{tcp: {destinationPort: {number: 81}}}]`, `
metadata: {name: pass-default}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: server}}}}
  ingress:
  - action: Pass
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: default}}}]`, `
metadata: {name: accept-all}
spec:
  tier: Admin
  priority: 2
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: server}}}}
  ingress:
  - action: Accept
    from: [{namespaces: {}}]`, `
metadata: {name: deny-ext}
spec:
  tier: Admin
  priority: 3
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: default}}}
  egress:
  - action: Deny
    to: [{networks: [203.0.113.0/24]}]`, `
metadata: {name: baseline-deny}
spec:
  tier: Baseline
  priority: 1
  subject: {namespaces: {}}
  ingress:
  - action: Deny
    from: [{namespaces: {}}]
    protocols: [{tcp: {destinationPort: {range: {start: 80, end: 81}}}}]`)
	if err := c.dp.UpdatePolicy(s); err != nil {
		t.Fatalf("UpdatePolicy: %v", err)
	}
	check := func() {
		t.Helper()
		c.expect(true,
			"a>b tcp/80", // Pass, then NetworkPolicy allows
			"c>b tcp/80", // Admin Accept of priority 2 (other is not passed)
			"c>b tcp/81", // Admin Accept
			"b>a udp/80", // Baseline denies TCP only
			"c>ext tcp/80", "ext>a tcp/80")
		c.expect(false,
			"a>b tcp/81",                             // Pass, then NetworkPolicy denies, though Accept follows
			"a>ext tcp/80",                           // Admin Deny of egress, no NetworkPolicy on a
			"b>a tcp/80", "c>a tcp/81", "b>c tcp/80") // Baseline Deny
	}
	check()
	drops, err := c.dp.Drops()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"egress-admin-deny", "ingress-baseline-deny", "ingress-policy-denied"} {
		if drops[name] == 0 {
			t.Errorf("drops %s = 0, want some (%v)", name, drops)
		}
	}

	c.open() // a restart: the table in force until the first snapshot
	check()
	if err := c.dp.UpdatePolicy(s); err != nil {
		t.Fatalf("UpdatePolicy after restart: %v", err)
	}
	check()

	if err := c.dp.UpdatePolicy(snapshotOf(t)); err != nil {
		t.Fatalf("without policies: %v", err)
	}
	c.expect(true, "a>b tcp/81", "a>ext tcp/80", "b>a tcp/80")
	c.sweep()
	if left := tierChains(t); len(left) > 0 {
		t.Errorf("tier chains left without cluster policies: %v", left)
	}
}

// TestRandomTiersMatchEngine is TestRandomPoliciesMatchEngine with random
// ClusterNetworkPolicies of both tiers beside the NetworkPolicies:
// colliding priorities, Accept, Deny and Pass, namespace, pod and network
// peers, ports and ranges. Every verdict of real traffic is compared with
// policy.Decide over the engine's compiled map, the decision the eBPF
// programs make, itself checked against the tier reference evaluator in
// daemon/policy (TestTiersMatchReference). NFTDP_SEED repeats a run.
func TestRandomTiersMatchEngine(t *testing.T) {
	rng, c, namespaces := newRandomWorld(t)
	for round := range 5 {
		s := policy.Snapshot{Namespaces: namespaces}
		for i := range rng.IntN(3) {
			s.Policies = append(s.Policies, randomPolicy(rng, fmt.Sprintf("p%d-%d", round, i)))
		}
		for i := range 1 + rng.IntN(4) {
			s.ClusterPolicies = append(s.ClusterPolicies, randomClusterPolicy(rng, fmt.Sprintf("c%d-%d", round, i)))
		}
		if err := c.dp.UpdatePolicy(s); err != nil {
			t.Fatalf("round %d: UpdatePolicy: %v", round, err)
		}
		c.checkAgainstEngine(t, s, round)
		if t.Failed() {
			for _, p := range s.Policies {
				t.Logf("round %d policy %s: %+v", round, p.Name, p.Spec)
			}
			for _, p := range s.ClusterPolicies {
				b, _ := yaml.Marshal(p.Spec)
				t.Logf("round %d cluster policy %s:\n%s", round, p.Name, b)
			}
			return
		}
	}
}

func randomClusterPolicy(rng *rand.Rand, name string) *cnpv1beta1.ClusterNetworkPolicy {
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	selector := func() *metav1.LabelSelector {
		switch rng.IntN(3) {
		case 0:
			return &metav1.LabelSelector{}
		case 1:
			return &metav1.LabelSelector{MatchLabels: map[string]string{"app": pick(apps...)}}
		}
		return &metav1.LabelSelector{MatchLabels: map[string]string{"team": pick("x", "y")}}
	}
	pods := func() *cnpv1beta1.NamespacedPod {
		return &cnpv1beta1.NamespacedPod{NamespaceSelector: *selector(),
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": pick(apps...)}}}
	}
	protocols := func() []cnpv1beta1.ClusterNetworkPolicyProtocol {
		switch rng.IntN(4) {
		case 0:
			return []cnpv1beta1.ClusterNetworkPolicyProtocol{{TCP: &cnpv1beta1.ClusterNetworkPolicyProtocolTCP{
				DestinationPort: &cnpv1beta1.Port{Number: int32(80 + rng.IntN(2))}}}}
		case 1:
			return []cnpv1beta1.ClusterNetworkPolicyProtocol{{TCP: &cnpv1beta1.ClusterNetworkPolicyProtocolTCP{
				DestinationPort: &cnpv1beta1.Port{Range: &cnpv1beta1.PortRange{Start: 79, End: 80}}}}}
		case 2:
			return []cnpv1beta1.ClusterNetworkPolicyProtocol{{UDP: &cnpv1beta1.ClusterNetworkPolicyProtocolUDP{}}}
		}
		return nil
	}
	action := func() cnpv1beta1.ClusterNetworkPolicyRuleAction {
		return cnpv1beta1.ClusterNetworkPolicyRuleAction(pick("Accept", "Deny", "Pass"))
	}
	cnp := &cnpv1beta1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}
	cnp.Spec.Tier = cnpv1beta1.Tier(pick("Admin", "Baseline"))
	cnp.Spec.Priority = int32(rng.IntN(3))
	if rng.IntN(2) == 0 {
		cnp.Spec.Subject.Namespaces = selector()
	} else {
		cnp.Spec.Subject.Pods = pods()
	}
	for range rng.IntN(3) {
		var peer cnpv1beta1.ClusterNetworkPolicyIngressPeer
		if rng.IntN(2) == 0 {
			peer.Namespaces = selector()
		} else {
			peer.Pods = pods()
		}
		cnp.Spec.Ingress = append(cnp.Spec.Ingress, cnpv1beta1.ClusterNetworkPolicyIngressRule{
			Action: action(), From: []cnpv1beta1.ClusterNetworkPolicyIngressPeer{peer}, Protocols: protocols()})
	}
	for range rng.IntN(3) {
		var peer cnpv1beta1.ClusterNetworkPolicyEgressPeer
		switch rng.IntN(3) {
		case 0:
			peer.Namespaces = selector()
		case 1:
			peer.Pods = pods()
		default:
			peer.Networks = []cnpv1beta1.CIDR{cnpv1beta1.CIDR(pick("198.51.100.0/24", "198.51.100.0/28", "198.51.100.12/32", "203.0.113.0/24", "0.0.0.0/0"))}
		}
		cnp.Spec.Egress = append(cnp.Spec.Egress, cnpv1beta1.ClusterNetworkPolicyEgressRule{
			Action: action(), To: []cnpv1beta1.ClusterNetworkPolicyEgressPeer{peer}, Protocols: protocols()})
	}
	return cnp
}

// TestClusterPolicyTiersDualStack: the tiers in both families, an IPv6
// networks peer inside the pods' range (the pod's class then holds its
// identity's and its CIDR identity's rules) and a Baseline Deny of a
// namespace over IPv4 and IPv6.
func TestClusterPolicyTiersDualStack(t *testing.T) {
	c := newCluster(t, true)
	s := withCluster(t, policy.Snapshot{}, `
metadata: {name: no-b6-from-a}
spec:
  tier: Admin
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}}
  egress:
  - action: Deny
    to: [{networks: ["2001:db8:1::11/128"]}]
  - action: Accept
    to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: server}}}}]
    protocols: [{tcp: {destinationPort: {number: 81}}}]`, `
metadata: {name: no-other}
spec:
  tier: Baseline
  priority: 1
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: server}}}}
  ingress:
  - action: Deny
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: other}}}]`)
	if err := c.dp.UpdatePolicy(s); err != nil {
		t.Fatalf("UpdatePolicy: %v", err)
	}
	c.expect(true, "a>b tcp/80", "a>b tcp/81", "b>a6 tcp/80", "b>c6 tcp/80")
	c.expect(false, "a>b6 tcp/80", "a>b6 tcp/81", "c>b tcp/80", "c>b6 tcp/80")
}

// TestClusterPolicyNodePeers: egress peers chosen by node labels over real
// traffic. "ext" and an unattached host "d" stand for two nodes: an Admin
// Deny to the infra node holds, an Admin Accept to the worker node opens
// what a NetworkPolicy closes, and swapping the nodes' labels swaps the
// verdicts with the policies unchanged.
func TestClusterPolicyNodePeers(t *testing.T) {
	c := newCluster(t, false)
	c.pods["d"] = testnet.NewPod(t, "d", podIPs["d"])
	node := func(name, role string, addr netip.Addr) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"role": role}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr.String()},
				{Type: corev1.NodeHostName, Address: name}}}}
	}
	s := withCluster(t, snapshotOf(t, policyDoc("no-egress", "default", `  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
`)), `
metadata: {name: deny-infra}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: default}}}
  egress:
  - action: Deny
    to: [{nodes: {matchLabels: {role: infra}}}]`, `
metadata: {name: accept-workers}
spec:
  tier: Admin
  priority: 2
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: default}}}
  egress:
  - action: Accept
    to: [{nodes: {matchLabels: {role: worker}}}]
    protocols: [{tcp: {destinationPort: {number: 80}}}]`)
	s.Nodes = []*corev1.Node{node("n-ext", "infra", podIPs["ext"]), node("n-d", "worker", podIPs["d"])}
	if err := c.dp.UpdatePolicy(s); err != nil {
		t.Fatalf("UpdatePolicy: %v", err)
	}
	c.expect(true, "a>d tcp/80", "c>ext tcp/80", "c>d tcp/81", "b>d tcp/81")
	c.expect(false, "a>ext tcp/80", "b>ext tcp/80", "a>d tcp/81")
	dec, err := c.dp.Decide(c.eps["b"].HostIfIndex, policy.Egress, podIPs["ext"], policy.ProtoTCP, 80)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.dp.DecidedBy(dec, policy.Egress, podIPs["ext"], policy.ProtoTCP, 80), "admin: ClusterNetworkPolicy/deny-infra spec.egress[0] Deny"; got != want {
		t.Errorf("b>ext tcp/80 decided by %q, want %q (%+v)", got, want, dec)
	}

	s.Nodes = []*corev1.Node{node("n-ext", "worker", podIPs["ext"]), node("n-d", "infra", podIPs["d"])}
	if err := c.dp.UpdatePolicy(s); err != nil {
		t.Fatalf("UpdatePolicy with the labels swapped: %v", err)
	}
	c.expect(true, "a>ext tcp/80", "c>d tcp/80", "b>ext tcp/81")
	c.expect(false, "a>d tcp/80", "b>d tcp/80", "a>ext tcp/81")
}
