package nftdp

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// TestRandomPoliciesMatchEngine drives real traffic between pods in
// network namespaces under random policy sets, applied one after the other
// as snapshot deltas, and compares every verdict with what the policy
// engine's compiled map decides for the same flow (policy.Decide, the
// decision the eBPF programs make): pod and namespace selectors,
// ipBlocks with except over pod and outside addresses, ports and
// protocols, both directions. The engine itself is checked against the
// reference evaluator in daemon/policy. NFTDP_SEED repeats a run.
func TestRandomPoliciesMatchEngine(t *testing.T) {
	rng, c, namespaces := newRandomWorld(t)
	for round := range 4 {
		s := policy.Snapshot{Namespaces: namespaces}
		for i := range 1 + rng.IntN(4) {
			s.Policies = append(s.Policies, randomPolicy(rng, fmt.Sprintf("p%d-%d", round, i)))
		}
		if err := c.dp.UpdatePolicy(s); err != nil {
			t.Fatalf("round %d: UpdatePolicy: %v", round, err)
		}
		c.checkAgainstEngine(t, s, round)
		if t.Failed() {
			for _, p := range s.Policies {
				t.Logf("round %d policy %s: %+v", round, p.Name, p.Spec)
			}
			return
		}
	}
}

var (
	apps   = []string{"client", "server"}
	blocks = []struct{ cidr, except string }{
		{"198.51.100.0/24", "198.51.100.11/32"}, {"203.0.113.0/24", ""}, {"0.0.0.0/0", "198.51.100.0/28"},
		{"198.51.100.12/32", ""}, {"203.0.0.0/8", "203.0.113.0/25"},
	}
)

func randomPolicy(rng *rand.Rand, name string) *networkingv1.NetworkPolicy {
	ns := []string{"default", "other"}[rng.IntN(2)]
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if rng.IntN(3) > 0 {
		np.Spec.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": apps[rng.IntN(2)]}}
	}
	peers := func() []networkingv1.NetworkPolicyPeer {
		var out []networkingv1.NetworkPolicyPeer
		for range rng.IntN(3) {
			var p networkingv1.NetworkPolicyPeer
			switch rng.IntN(4) {
			case 0:
				p.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": apps[rng.IntN(2)]}}
			case 1:
				p.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": []string{"x", "y"}[rng.IntN(2)]}}
				if rng.IntN(2) == 0 {
					p.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": apps[rng.IntN(2)]}}
				}
			default:
				b := blocks[rng.IntN(len(blocks))]
				p.IPBlock = &networkingv1.IPBlock{CIDR: b.cidr}
				if b.except != "" {
					p.IPBlock.Except = []string{b.except}
				}
			}
			out = append(out, p)
		}
		return out
	}
	ports := func() []networkingv1.NetworkPolicyPort {
		var out []networkingv1.NetworkPolicyPort
		for range rng.IntN(3) {
			proto := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP}[rng.IntN(2)]
			port := intstr.FromInt32(int32(80 + rng.IntN(2)))
			pp := networkingv1.NetworkPolicyPort{Protocol: &proto}
			if rng.IntN(4) > 0 {
				pp.Port = &port
			}
			out = append(out, pp)
		}
		return out
	}
	ingress, egress := rng.IntN(3) > 0, rng.IntN(2) == 0
	if !ingress && !egress {
		ingress = true
	}
	if ingress {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
		for range rng.IntN(3) {
			np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers(), Ports: ports()})
		}
	}
	if egress {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		for range rng.IntN(3) {
			np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peers(), Ports: ports()})
		}
	}
	return np
}

// checkAgainstEngine probes every pod and the outside host towards every
// pod and the outside host (TCP 80 and 81, UDP 80) and compares.
func (c *cluster) checkAgainstEngine(t *testing.T, s policy.Snapshot, round int) {
	t.Helper()
	ids := map[string]identity.Identity{}
	var all []identity.Identity
	var local []identity.ID
	c.dp.mu.Lock()
	for name, ep := range c.eps {
		r := c.dp.eps[ep.Key]
		ids[name] = identity.Identity{ID: r.Identity, Namespace: r.Namespace, Labels: r.Labels}
	}
	c.dp.mu.Unlock()
	seen := map[identity.ID]bool{}
	for _, id := range ids {
		if !seen[id.ID] {
			seen[id.ID] = true
			all = append(all, id)
			local = append(local, id.ID)
		}
	}
	res, err := policy.Compile(policy.Input{Snapshot: s, Identities: all, Local: local}, identity.NewCIDRs())
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	// side is one end of a flow at an endpoint: its identity, or none for
	// the outside host.
	remoteOf := func(name string) (identity.ID, identity.ID) {
		addr := podIPs[name]
		cidr := res.CIDRIdentity(addr)
		if id, ok := ids[name]; ok {
			return id.ID, cidr
		}
		return cidr, cidr
	}
	allowed := func(from, to string, proto uint8, port uint16) bool {
		ok := true
		if id, isEP := ids[from]; isEP {
			r, rc := remoteOf(to)
			ok = ok && policy.Decide(res.Lookup, policy.Flow{Local: id.ID, Isolation: res.Isolation[id.ID], Dir: policy.Egress,
				Remote: r, RemoteCIDR: rc, Proto: proto, Port: port}).Allow
		}
		if id, isEP := ids[to]; isEP {
			r, rc := remoteOf(from)
			ok = ok && policy.Decide(res.Lookup, policy.Flow{Local: id.ID, Isolation: res.Isolation[id.ID], Dir: policy.Ingress,
				Remote: r, RemoteCIDR: rc, Proto: proto, Port: port}).Allow
		}
		return ok
	}
	type probe struct {
		check string
		want  bool
	}
	var probes []probe
	names := []string{"a", "b", "c", "d", "ext"}
	for _, from := range names {
		for _, to := range names {
			if from == to {
				continue
			}
			for _, pp := range []struct {
				proto string
				num   uint8
				port  uint16
			}{{"tcp", policy.ProtoTCP, 80}, {"tcp", policy.ProtoTCP, 81}, {"udp", policy.ProtoUDP, 80}} {
				probes = append(probes, probe{fmt.Sprintf("%s>%s %s/%d", from, to, pp.proto, pp.port), allowed(from, to, pp.num, pp.port)})
			}
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, len(probes))
	for i, p := range probes {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.probe(p.check) }()
	}
	wg.Wait()
	for i, p := range probes {
		if got := errs[i] == nil; got != p.want {
			t.Errorf("round %d: %s: got allowed=%v (%v), the engine says %v", round, p.check, got, errs[i], p.want)
		}
	}
}

// newRandomWorld is the randomized tests' start: a seeded generator
// (NFTDP_SEED repeats a run), the cluster with a fourth pod in another
// namespace, and the two namespaces with the labels the policies select.
func newRandomWorld(t *testing.T) (*rand.Rand, *cluster, []*corev1.Namespace) {
	seed := rand.Uint64()
	if s := os.Getenv("NFTDP_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (NFTDP_SEED=%d repeats this run)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	c := newCluster(t, false)
	c.addPod("d", "other", map[string]string{"app": "server"})
	namespaces := []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "default", Labels: map[string]string{policy.NamespaceNameLabel: "default", "team": "x"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "other", Labels: map[string]string{policy.NamespaceNameLabel: "other", "team": "y"}}},
	}
	return rng, c, namespaces
}
