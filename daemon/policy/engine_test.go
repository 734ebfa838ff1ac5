package policy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"
)

// fuzzWorld is the state a random sequence of operations builds, kept
// alongside an incrementally driven Engine and compared after every step
// with the former whole-snapshot compiler (referenceCompile) by verdicts.
type fuzzWorld struct {
	rng      *rand.Rand
	e        *Engine
	ids      map[identity.ID]identity.Identity
	local    map[identity.ID]int
	policies map[string]*networkingv1.NetworkPolicy
	nsLabels map[string]map[string]string
	nextID   identity.ID
	// unannounced identities exist only through local references.
	unannounced map[identity.ID]bool
	// named are the pods' named ports fed to the engine, by pod key.
	named map[string]PodPorts
}

var (
	fuzzNamespaces = []string{"a", "b", "c"}
	fuzzApps       = []string{"web", "db", "cache"}
	fuzzTiers      = []string{"fe", "be"}
	fuzzPorts      = []uint16{53, 80, 81, 443, 8080}
	fuzzAddrs      = []string{"10.1.2.3", "10.1.200.1", "10.9.9.9", "192.168.1.1", "8.8.8.8", "fd00::1", "2001:db8::5"}
	fuzzPortNames  = []string{"http", "dns", "metrics"}
	fuzzBlocks     = []string{"10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "0.0.0.0/0", "192.168.0.0/16", "fd00::/8", "::/0"}
)

func (w *fuzzWorld) labelSet() map[string]string {
	l := map[string]string{"app": fuzzApps[w.rng.IntN(len(fuzzApps))]}
	if w.rng.IntN(2) == 0 {
		l["tier"] = fuzzTiers[w.rng.IntN(len(fuzzTiers))]
	}
	if w.rng.IntN(3) == 0 {
		l["uniq"] = fmt.Sprint(w.rng.IntN(1000))
	}
	return l
}

func (w *fuzzWorld) selector() *metav1.LabelSelector {
	switch w.rng.IntN(6) {
	case 0:
		return &metav1.LabelSelector{}
	case 1:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "tier", Operator: metav1.LabelSelectorOpExists}}}
	case 2:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"web", "db"}}}}
	case 3:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"web"}}}}
	case 4:
		return &metav1.LabelSelector{MatchLabels: map[string]string{"app": fuzzApps[w.rng.IntN(len(fuzzApps))],
			"tier": fuzzTiers[w.rng.IntN(len(fuzzTiers))]}}
	}
	return &metav1.LabelSelector{MatchLabels: map[string]string{"app": fuzzApps[w.rng.IntN(len(fuzzApps))]}}
}

func (w *fuzzWorld) nsSelector() *metav1.LabelSelector {
	switch w.rng.IntN(3) {
	case 0:
		return &metav1.LabelSelector{}
	case 1:
		return &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}
	}
	return &metav1.LabelSelector{MatchLabels: map[string]string{NamespaceNameLabel: fuzzNamespaces[w.rng.IntN(3)]}}
}

func (w *fuzzWorld) peers() []networkingv1.NetworkPolicyPeer {
	var out []networkingv1.NetworkPolicyPeer
	for range w.rng.IntN(3) {
		switch w.rng.IntN(4) {
		case 0:
			out = append(out, networkingv1.NetworkPolicyPeer{PodSelector: w.selector()})
		case 1:
			out = append(out, networkingv1.NetworkPolicyPeer{NamespaceSelector: w.nsSelector()})
		case 2:
			out = append(out, networkingv1.NetworkPolicyPeer{NamespaceSelector: w.nsSelector(), PodSelector: w.selector()})
		default:
			b := fuzzBlocks[w.rng.IntN(len(fuzzBlocks))]
			blk := &networkingv1.IPBlock{CIDR: b}
			if b == "10.0.0.0/8" && w.rng.IntN(2) == 0 {
				blk.Except = []string{"10.1.0.0/16"}
			}
			out = append(out, networkingv1.NetworkPolicyPeer{IPBlock: blk})
		}
	}
	return out
}

func (w *fuzzWorld) ports() []networkingv1.NetworkPolicyPort {
	var out []networkingv1.NetworkPolicyPort
	for range w.rng.IntN(3) {
		proto := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP}[w.rng.IntN(2)]
		p := networkingv1.NetworkPolicyPort{Protocol: &proto}
		switch w.rng.IntN(5) {
		case 0:
		case 4:
			port := intstr.FromString(fuzzPortNames[w.rng.IntN(len(fuzzPortNames))])
			p.Port = &port
		case 1:
			port := intstr.FromInt32(80)
			end := int32(443)
			p.Port, p.EndPort = &port, &end
		default:
			port := intstr.FromInt32(int32(fuzzPorts[w.rng.IntN(len(fuzzPorts))]))
			p.Port = &port
		}
		out = append(out, p)
	}
	return out
}

func (w *fuzzWorld) policy() *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{
		Namespace: fuzzNamespaces[w.rng.IntN(3)], Name: fmt.Sprint("p", w.rng.IntN(12))}}
	np.Spec.PodSelector = *w.selector()
	switch w.rng.IntN(3) {
	case 0:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	case 1:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	default:
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	}
	for range w.rng.IntN(3) {
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: w.peers(), Ports: w.ports()})
	}
	for range w.rng.IntN(3) {
		np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: w.peers(), Ports: w.ports()})
	}
	return np
}

// step applies one random operation to both the world and the engine.
func (w *fuzzWorld) step() string {
	switch op := w.rng.IntN(15); {
	case op == 11 || op == 13 || op == 14:
		// A pod (of any identity, here or elsewhere) and its named ports.
		pod := PodPorts{Key: fmt.Sprint("pod", w.rng.IntN(8)), ID: identity.ID(w.rng.IntN(int(w.nextID-identity.FirstPod)+1)) + identity.FirstPod,
			Local: w.rng.IntN(2) == 0}
		if local := slices.Sorted(maps.Keys(w.local)); len(local) > 0 && w.rng.IntN(2) == 0 {
			// Mostly pods of identities that are local here (selected).
			pod.ID = local[w.rng.IntN(len(local))]
		}
		for range w.rng.IntN(3) {
			pod.Ports = append(pod.Ports, NamedPort{Name: fuzzPortNames[w.rng.IntN(len(fuzzPortNames))],
				Protocol: []uint8{ProtoTCP, ProtoUDP}[w.rng.IntN(2)], Port: fuzzPorts[w.rng.IntN(len(fuzzPorts))]})
		}
		w.named[pod.Key] = pod
		w.e.SetNamedPorts(pod)
		return fmt.Sprintf("named ports %+v", pod)
	case op == 12:
		key := fmt.Sprint("pod", w.rng.IntN(8))
		delete(w.named, key)
		w.e.RemoveNamedPorts(key)
		return "named ports of " + key + " gone"
	case op < 3:
		np := w.policy()
		p, err := policyir.Normalize(np)
		if err != nil {
			panic(err)
		}
		w.policies[p.Key()] = np
		w.e.UpsertPolicy(p)
		return "upsert policy " + p.Key()
	case op == 3:
		for _, k := range slices.Sorted(maps.Keys(w.policies)) {
			ns, name, _ := strings.Cut(k, "/")
			delete(w.policies, k)
			w.e.DeletePolicy(ns, name)
			return "delete policy " + k
		}
	case op == 4 || op == 10:
		ns := fuzzNamespaces[w.rng.IntN(3)]
		var l map[string]string
		if w.rng.IntN(3) > 0 {
			l = map[string]string{"team": []string{"blue", "red"}[w.rng.IntN(2)]}
		}
		w.nsLabels[ns] = l
		w.e.SetNamespace(ns, l)
		return fmt.Sprintf("namespace %s labels %v", ns, l)
	case op == 5:
		id := identity.Identity{ID: w.nextID, Namespace: fuzzNamespaces[w.rng.IntN(3)], Labels: w.labelSet()}
		w.nextID++
		w.ids[id.ID] = id
		w.e.UpsertIdentity(id)
		return fmt.Sprintf("announce %d %s %v", id.ID, id.Namespace, id.Labels)
	case op == 6:
		for _, id := range slices.Sorted(maps.Keys(w.ids)) {
			if w.local[id] > 0 || w.rng.IntN(2) == 0 {
				continue
			}
			delete(w.ids, id)
			w.e.DeleteIdentity(id)
			return fmt.Sprintf("withdraw %d", id)
		}
	case op < 9:
		// A local endpoint: an announced identity or a new one.
		var id identity.Identity
		if len(w.ids) > 0 && w.rng.IntN(2) == 0 {
			keys := slices.Sorted(maps.Keys(w.ids))
			id = w.ids[keys[w.rng.IntN(len(keys))]]
		} else {
			id = identity.Identity{ID: w.nextID, Namespace: fuzzNamespaces[w.rng.IntN(3)], Labels: w.labelSet()}
			w.nextID++
		}
		w.local[id.ID]++
		if _, known := w.ids[id.ID]; !known {
			w.ids[id.ID] = id
			w.unannounced[id.ID] = true
		}
		w.e.AddLocal(id)
		return fmt.Sprintf("local +%d", id.ID)
	default:
		// The lowest local identity loses one endpoint.
		if ids := slices.Sorted(maps.Keys(w.local)); len(ids) > 0 {
			id := ids[0]
			w.local[id]--
			if w.local[id] == 0 {
				delete(w.local, id)
				if w.unannounced[id] {
					delete(w.unannounced, id)
					delete(w.ids, id)
				}
			}
			w.e.RemoveLocal(id)
			return fmt.Sprintf("local -%d", id)
		}
	}
	return "noop"
}

// verdicts evaluates every (local, remote, direction, protocol, port) the
// world can express under res and tbl.
func (w *fuzzWorld) verdicts(iso func(identity.ID) Isolation, tbl Table, cidr func(netip.Addr) identity.ID) []string {
	var out []string
	var remotes []string
	for _, id := range slices.Sorted(maps.Keys(w.ids)) {
		remotes = append(remotes, fmt.Sprint(id))
	}
	remotes = append(remotes, fuzzAddrs...)
	for _, local := range slices.Sorted(maps.Keys(w.local)) {
		for _, remote := range remotes {
			for _, dir := range []Direction{Ingress, Egress} {
				for _, proto := range []uint8{ProtoTCP, ProtoUDP} {
					for _, port := range fuzzPorts {
						f := Flow{Local: local, Isolation: iso(local), Dir: dir, Proto: proto, Port: port, RemoteCIDR: identity.World}
						if a, err := netip.ParseAddr(remote); err == nil {
							f.Remote = cidr(a)
							f.RemoteCIDR = f.Remote
						} else {
							var n uint32
							fmt.Sscan(remote, &n)
							f.Remote = identity.ID(n)
						}
						if tbl.Allowed(f) {
							out = append(out, fmt.Sprintf("%d %s %s %d/%d", local, dir, remote, proto, port))
						}
					}
				}
			}
		}
	}
	return out
}

func TestEngineMatchesReferenceCompiler(t *testing.T) {
	for seed := range uint64(25) {
		w := &fuzzWorld{rng: rand.New(rand.NewPCG(seed, 7)), e: NewEngine(identity.NewCIDRs()),
			ids: map[identity.ID]identity.Identity{}, local: map[identity.ID]int{}, policies: map[string]*networkingv1.NetworkPolicy{},
			nsLabels: map[string]map[string]string{}, nextID: identity.FirstPod, unannounced: map[identity.ID]bool{},
			named: map[string]PodPorts{}}
		var history []string
		for step := range 40 {
			history = append(history, w.step())
			if errs := w.e.TakeErrors(); len(errs) > 0 {
				t.Fatalf("seed %d: engine errors %v", seed, errs)
			}
			in := Input{}
			for _, k := range slices.Sorted(maps.Keys(w.policies)) {
				in.Policies = append(in.Policies, w.policies[k])
			}
			for _, ns := range slices.Sorted(maps.Keys(w.nsLabels)) {
				if w.nsLabels[ns] != nil {
					in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: w.nsLabels[ns]}})
				}
			}
			for _, id := range slices.Sorted(maps.Keys(w.ids)) {
				in.Identities = append(in.Identities, w.ids[id])
				if w.local[id] > 0 {
					in.Local = append(in.Local, id)
				}
			}
			for _, k := range slices.Sorted(maps.Keys(w.named)) {
				in.NamedPorts = append(in.NamedPorts, w.named[k])
			}
			ref, err := referenceCompile(in, identity.NewCIDRs())
			if err != nil {
				t.Fatal(err)
			}
			tbl := Table{}
			w.e.Keys(func(k Key) { tbl[k] = struct{}{} })
			got := w.verdicts(w.e.Isolation, tbl, w.e.CIDRIdentity)
			want := w.verdicts(func(id identity.ID) Isolation { return ref.Isolation[id] }, ref.Table(), ref.CIDRIdentity)
			if !slices.Equal(got, want) {
				extra, missing := diff(got, want), diff(want, got)
				t.Fatalf("seed %d step %d: engine differs from the reference\nallowed only by the engine: %v\nallowed only by the reference: %v\nhistory:\n  %s",
					seed, step, head(extra), head(missing), strings.Join(history, "\n  "))
			}
		}
	}
}

// TestEngineChangesAreLocal checks that an operation reports only the keys
// whose wanted state flipped, and that undoing it restores the key set.
func TestEngineChangesAreLocal(t *testing.T) {
	w := newWorld()
	e := NewEngine(identity.NewCIDRs())
	for _, ns := range w.nss {
		e.SetNamespace(ns.Name, ns.Labels)
	}
	for _, id := range w.ids {
		e.AddLocal(id)
	}
	for _, np := range mustPolicies(t, denyIngressA, `
metadata: {name: allow-x, namespace: a}
spec:
  podSelector: {matchLabels: {pod: "y"}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: x}}}], ports: [{port: 80}]}]`) {
		p, err := policyir.Normalize(np)
		if err != nil {
			t.Fatal(err)
		}
		e.UpsertPolicy(p)
	}
	e.TakeChanges()
	before := map[Key]bool{}
	e.Keys(func(k Key) { before[k] = true })
	// A new pod labelled like a/x is a new peer of allow-x: one key.
	id := identity.Identity{ID: 999, Namespace: "a", Labels: map[string]string{"pod": "x", "app": "other"}}
	e.AddLocal(id)
	ch := e.TakeChanges()
	if len(ch.Keys) != 1 {
		t.Fatalf("new peer changed %d keys, want 1: %v", len(ch.Keys), ch.Keys)
	}
	for k := range ch.Keys {
		if !e.WantsKey(k) || k.Remote != 999 || k.Local != w.ids["a/y"].ID {
			t.Fatalf("unexpected key %+v", k)
		}
	}
	if _, ok := ch.Isolation[999]; !ok || e.Isolation(999) != IngressIsolated {
		t.Fatalf("isolation of the new local identity = %v (changed %v)", e.Isolation(999), ch.Isolation)
	}
	e.RemoveLocal(999)
	after := map[Key]bool{}
	e.Keys(func(k Key) { after[k] = true })
	if !maps.Equal(before, after) {
		t.Fatalf("keys after add+remove differ: %d vs %d", len(before), len(after))
	}
}

func diff(a, b []string) []string {
	var out []string
	for _, x := range a {
		if !slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

func head(xs []string) []string {
	if len(xs) > 8 {
		return xs[:8]
	}
	return xs
}

// benchPolicies is n policies shaped like the scale benchmark's (test/policybench -scale).
func benchPolicies(b *testing.B, n int) []*policyir.Policy {
	var out []*policyir.Policy
	for i := range n {
		np := mustPoliciesB(b, fmt.Sprintf(`
metadata: {name: p%d, namespace: bench}
spec:
  podSelector: {matchLabels: {app: svc-%d}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: svc-%d}}}]
    ports: [{port: %d}]
  - from: [{namespaceSelector: {matchLabels: {team: t%d}}}]
  egress: [{to: [{ipBlock: {cidr: 10.%d.%d.0/24}}], ports: [{protocol: UDP, port: 53}]}]
  policyTypes: [Ingress, Egress]`, i, i, (i+1)%n, 8000+i%1000, i%50, 100+i/256%100, i%256))[0]
		p, err := policyir.Normalize(np)
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// benchClusterPolicies are n ClusterNetworkPolicies alternating tiers, each
// for the pods of one team's namespaces, denying another team and passing
// or accepting a port range to a network.
func benchClusterPolicies(b *testing.B, n int) []*policyir.Policy {
	var out []*policyir.Policy
	for i := range n {
		cnp := &cnpv1beta1.ClusterNetworkPolicy{}
		doc := fmt.Sprintf(`
metadata: {name: c%d}
spec:
  tier: %s
  priority: %d
  subject: {namespaces: {matchLabels: {team: t%d}}}
  ingress: [{action: Deny, from: [{namespaces: {matchLabels: {team: t%d}}}]}]
  egress:
  - {action: %s, to: [{networks: [10.%d.%d.0/24]}], protocols: [{tcp: {destinationPort: {range: {start: 8000, end: 8999}}}}]}`,
			i, []string{"Admin", "Baseline"}[i%2], i%1000, i%50, (i+7)%50, []string{"Pass", "Accept"}[i%2], 200+i/256%50, i%256)
		if err := yaml.UnmarshalStrict([]byte(doc), cnp); err != nil {
			b.Fatal(err)
		}
		p, err := policyir.NormalizeCluster(cnp)
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// BenchmarkEngineNewLocalIdentity is the engine's share of a pod ADD: a new
// label set, selected by one policy and named as a peer by another, with
// 0, 1k and 10k policies loaded (compare ns/op across sizes: the work
// should not grow with the policy count).
//
// The "+1000-cluster" case adds 1,000 ClusterNetworkPolicies of both tiers
// (issue 38's ratio: at most 1.25x the case without them).
func BenchmarkEngineNewLocalIdentity(b *testing.B) {
	for _, sz := range []struct{ n, cluster int }{{0, 0}, {1000, 0}, {10000, 0}, {10000, 1000}} {
		n := sz.n
		name := fmt.Sprint(n, "-policies")
		if sz.cluster > 0 {
			name += fmt.Sprint("+", sz.cluster, "-cluster")
		}
		b.Run(name, func(b *testing.B) {
			e := NewEngine(identity.NewCIDRs())
			for i := range 50 {
				e.SetNamespace(fmt.Sprint("team-", i), map[string]string{"team": fmt.Sprint("t", i)})
			}
			for _, p := range benchPolicies(b, n) {
				e.UpsertPolicy(p)
			}
			for _, p := range benchClusterPolicies(b, sz.cluster) {
				e.UpsertPolicy(p)
			}
			next := identity.FirstPod
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				app := fmt.Sprint("svc-", i)
				if n > 0 {
					app = fmt.Sprint("svc-", i%n)
				}
				id := identity.Identity{ID: next, Namespace: "bench", Labels: map[string]string{"app": app, "pod": fmt.Sprint(i)}}
				next++
				e.AddLocal(id)
				e.TakeChanges()
				e.RemoveLocal(id.ID)
				e.TakeChanges()
			}
		})
	}
}
