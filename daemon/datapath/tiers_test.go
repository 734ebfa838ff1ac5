package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/daemon/policy"
)

// Cluster policies of TestClusterNetworkPolicyTiers (pods: a client and b
// server in default, c client in other, ext the world).
const (
	adminDenyServer = `
kind: ClusterNetworkPolicy
metadata: {name: deny-server}
spec:
  tier: Admin
  priority: 20
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: server}}}}
  ingress:
  - action: Deny
    from: [{namespaces: {}}]
    protocols: [{tcp: {destinationPort: {range: {start: 80, end: 81}}}}]`
	adminPassDefault = `
kind: ClusterNetworkPolicy
metadata: {name: pass-default}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: default}}}
  ingress:
  - action: Pass
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: default}}}]`
	baselineDenyOther = `
kind: ClusterNetworkPolicy
metadata: {name: baseline-other}
spec:
  tier: Baseline
  priority: 5
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: default}}}
  ingress:
  - action: Deny
    from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: other}}}]`
	adminDenyWorld = `
kind: ClusterNetworkPolicy
metadata: {name: deny-world}
spec:
  tier: Admin
  priority: 30
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}}
  egress:
  - action: Deny
    to: [{networks: [203.0.113.0/24]}]
    protocols: [{tcp: {destinationPort: {number: 80}}}]`
	otherToServer = `
metadata: {name: from-other, namespace: default}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: other}}, podSelector: {matchLabels: {app: client}}}]}]`
)

// TestClusterNetworkPolicyTiers sends real traffic through the programs:
// an Admin Deny overrides a NetworkPolicy allow, a higher-precedence Pass
// hands the decision back to NetworkPolicy (which allows and denies as
// alone), a Baseline Deny applies only to a pod no NetworkPolicy isolates,
// and a networks peer matches through the ipcache's prefixes. Flow events
// carry admin-deny and baseline-deny; Decide names the tier and rank.
func TestClusterNetworkPolicyTiers(t *testing.T) {
	c := newCluster(t, AttachTCX)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flows := make(chan Flow, 1024)
	go func() { _ = c.dp.ReadFlows(ctx, func(f Flow) { flows <- f }) }()

	c.policies(serverIngress)
	c.expect(true, "a>b tcp/80", "a>ext tcp/80")
	c.expect(false, "a>b tcp/81", "c>b tcp/80")

	// Admin Deny beats the NetworkPolicy allow; ports outside the rule are
	// still NetworkPolicy's.
	c.policies(serverIngress, adminDenyServer)
	c.expect(false, "a>b tcp/80", "a>b tcp/81")
	c.expect(true, "node>b tcp/80")
	waitFlow(t, flows, "admin-deny", "b")
	dec, err := c.dp.Decide(c.eps["b"].HostIfIndex, policy.Ingress, podIPs["a"], policy.ProtoTCP, 80)
	if err != nil {
		t.Fatal(err)
	}
	if dec.Allowed() || dec.Tier != policyir.TierAdmin || dec.Action != policyir.ActionDeny || dec.Rank != 20*25 || dec.Reason != "admin-deny" {
		t.Errorf("Decide a>b tcp/80 = %+v, want admin Deny rank 500", dec)
	}
	decidedBy(t, c, "b", policy.Ingress, podIPs["a"], 80, "admin: ClusterNetworkPolicy/deny-server spec.ingress[0] Deny")

	// Pass at priority 10 comes first for pods of default: NetworkPolicy
	// decides again (80 allowed, 81 not); c, not passed, stays denied.
	c.policies(serverIngress, adminDenyServer, adminPassDefault)
	c.expect(true, "a>b tcp/80")
	c.expect(false, "a>b tcp/81", "c>b tcp/80")

	// Baseline Deny from other: a (no NetworkPolicy isolates its ingress)
	// is cut off from c; b, isolated by a NetworkPolicy allowing c, is not.
	c.policies(serverIngress, otherToServer, baselineDenyOther)
	c.expect(false, "c>a tcp/80")
	c.expect(true, "c>b tcp/80", "b>a tcp/80", "node>a tcp/80")
	waitFlow(t, flows, "baseline-deny", "a")
	decidedBy(t, c, "a", policy.Ingress, podIPs["c"], 80, "baseline: ClusterNetworkPolicy/baseline-other spec.ingress[0] Deny")

	// A networks peer: egress from clients to the world's /24, port 80.
	c.policies(adminDenyWorld)
	c.expect(false, "a>ext tcp/80", "c>ext tcp/80")
	c.expect(true, "a>ext tcp/81", "a>b tcp/80")
	decidedBy(t, c, "a", policy.Egress, podIPs["ext"], 80, "admin: ClusterNetworkPolicy/deny-world spec.egress[0] Deny")

	// All gone: the default again.
	c.policies()
	c.expect(true, "a>b tcp/80", "c>a tcp/80", "a>ext tcp/80")
}

// waitFlow waits for a dropped flow event with reason at endpoint pod.
func waitFlow(t *testing.T, flows chan Flow, reason, pod string) {
	t.Helper()
	deadline := time.After(3 * time.Second)
	for {
		select {
		case f := <-flows:
			if f.Verdict == "dropped" && f.Reason == reason && f.Dst == podIPs[pod] {
				return
			}
		case <-deadline:
			t.Fatalf("no %s flow event at %s", reason, pod)
		}
	}
}

// decidedBy checks the rule explain names for a new TCP flow at pod.
func decidedBy(t *testing.T, c *cluster, pod string, dir policy.Direction, peer netip.Addr, port uint16, want string) {
	t.Helper()
	dec, err := c.dp.Decide(c.eps[pod].HostIfIndex, dir, peer, policy.ProtoTCP, port)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.dp.DecidedBy(dec, dir, peer, policy.ProtoTCP, port); got != want {
		t.Errorf("at %s %s from %s: decided by %q, want %q (decision %+v)", pod, dir, peer, got, want, dec)
	}
}

// TestClusterPoliciesLeftOutWithoutTiers: programs loaded without the tiers
// (a kernel whose verifier refuses them; here told so) leave every cluster
// policy out of the maps, where the untiered path would read its entries
// as allows: NetworkPolicy decides as alone, an Admin Deny does not open
// or close anything, and the update's error names the policies left out.
func TestClusterPoliciesLeftOutWithoutTiers(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, Features: kernel.Probe().Without(kernel.TCX)}, false)
	err := c.tryPolicies(serverIngress, adminDenyServer, baselineDenyOther)
	if err == nil || !strings.Contains(err.Error(), "baseline-other, deny-server") {
		t.Fatalf("UpdatePolicy: %v, want the cluster policies named as not enforced", err)
	}
	c.expect(true, "a>b tcp/80")
	c.expect(false, "a>b tcp/81", "c>b tcp/80")
}

// nodeDoc is a Node with one role label and one address.
func nodeDoc(name, role string, addr netip.Addr) string {
	return fmt.Sprintf("kind: Node\nmetadata: {name: %s, labels: {role: %s}}\nstatus: {addresses: [{type: InternalIP, address: %q}]}", name, role, addr)
}

// TestClusterPolicyNodePeers: egress peers chosen by node labels through
// the ipcache's prefixes. "ext" and an unattached host "d" stand for two
// nodes: an Admin Deny to the infra node holds, an Admin Accept to the
// worker node opens what a NetworkPolicy closes, and swapping the nodes'
// labels swaps the verdicts with the policies unchanged.
func TestClusterPolicyNodePeers(t *testing.T) {
	c := newCluster(t, AttachTCX)
	c.pods["d"] = testnet.NewPod(t, "d", podIPs["d"])
	const noEgress = `
metadata: {name: no-egress, namespace: default}
spec: {podSelector: {matchLabels: {app: client}}, policyTypes: [Egress]}`
	const denyInfra = `
kind: ClusterNetworkPolicy
metadata: {name: deny-infra}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: default}}}
  egress:
  - action: Deny
    to: [{nodes: {matchLabels: {role: infra}}}]`
	const acceptWorkers = `
kind: ClusterNetworkPolicy
metadata: {name: accept-workers}
spec:
  tier: Admin
  priority: 2
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: default}}}
  egress:
  - action: Accept
    to: [{nodes: {matchLabels: {role: worker}}}]
    protocols: [{tcp: {destinationPort: {number: 80}}}]`
	c.policies(noEgress, denyInfra, acceptWorkers, nodeDoc("n-ext", "infra", podIPs["ext"]), nodeDoc("n-d", "worker", podIPs["d"]),
		nodeDoc("n-self", "infra", testnet.NodeIP))
	c.expect(true, "a>d tcp/80", "c>ext tcp/80", "c>d tcp/81", "b>d tcp/81")
	c.expect(false, "a>ext tcp/80", "b>ext tcp/80", "a>d tcp/81")
	decidedBy(t, c, "b", policy.Egress, podIPs["ext"], 80, "admin: ClusterNetworkPolicy/deny-infra spec.egress[0] Deny")
	// This node's own address keeps its node identity in the ipcache; the
	// nodes peer matches it through the CIDR identity of its /32.
	dec, err := c.dp.Decide(c.eps["b"].HostIfIndex, policy.Egress, testnet.NodeIP, policy.ProtoTCP, 80)
	if err != nil {
		t.Fatal(err)
	}
	if dec.Remote != identity.Host || !dec.RemoteCIDR.IsCIDR() || dec.Allowed() || dec.Tier != policyir.TierAdmin {
		t.Errorf("b>node: decision %+v, want remote host, a CIDR identity and the Admin Deny", dec)
	}

	c.policies(noEgress, denyInfra, acceptWorkers, nodeDoc("n-ext", "worker", podIPs["ext"]), nodeDoc("n-d", "infra", podIPs["d"]))
	c.expect(true, "a>ext tcp/80", "c>d tcp/80", "b>ext tcp/81")
	c.expect(false, "a>d tcp/80", "b>d tcp/80", "a>ext tcp/81")
}
