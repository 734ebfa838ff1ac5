package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/coordino/coordino/daemon/identity"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The fixture mirrors the upstream network-policy e2e model: namespaces a, b,
// c (labelled ns=<name>), each with pods x, y, z (labelled pod=<name>), pod
// IP 10.0.<ns>.<pod>; the node is 192.168.255.1; anything else is external.
var (
	fixtureNS   = []string{"a", "b", "c"}
	fixturePods = []string{"x", "y", "z"}
	nodeIP      = netip.MustParseAddr("192.168.255.1")
)

type world struct {
	ids  map[string]identity.Identity // "a/x" → identity
	ips  map[string]netip.Addr
	nss  []*corev1.Namespace
	byIP map[netip.Addr]identity.ID
}

func newWorld() *world {
	w := &world{ids: map[string]identity.Identity{}, ips: map[string]netip.Addr{}, byIP: map[netip.Addr]identity.ID{}}
	alloc := identity.NewAllocator()
	for i, ns := range fixtureNS {
		w.nss = append(w.nss, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"ns": ns}}})
		for j, pod := range fixturePods {
			id, _, _ := alloc.Acquire(ns, map[string]string{"pod": pod, "app": "demo"})
			name := ns + "/" + pod
			w.ids[name] = id
			w.ips[name] = netip.AddrFrom4([4]byte{10, 0, byte(i + 1), byte(j + 1)})
			w.byIP[w.ips[name]] = id.ID
		}
	}
	return w
}

func (w *world) input(nps []*networkingv1.NetworkPolicy) Input {
	in := Input{Snapshot: Snapshot{Policies: nps, Namespaces: w.nss}}
	for _, id := range w.ids {
		in.Identities = append(in.Identities, id)
		in.Local = append(in.Local, id.ID)
	}
	return in
}

// end resolves "a/x", "node" or an IP address to (identity, address).
func (w *world) end(s string, res *Result) (id identity.ID, addr netip.Addr, pod bool) {
	if s == "node" {
		return identity.Host, nodeIP, false
	}
	if id, ok := w.ids[s]; ok {
		return id.ID, w.ips[s], true
	}
	addr = netip.MustParseAddr(s)
	if pid, ok := w.byIP[addr]; ok {
		return pid, addr, true
	}
	return res.CIDRIdentity(addr), addr, false
}

// reachable evaluates "from>to proto/port" as the two endpoint programs do.
func (w *world) reachable(t *testing.T, res *Result, tbl Table, check string) bool {
	t.Helper()
	fromTo, pp, _ := strings.Cut(check, " ")
	from, to, _ := strings.Cut(fromTo, ">")
	protoName, portStr, _ := strings.Cut(pp, "/")
	proto := map[string]uint8{"tcp": ProtoTCP, "udp": ProtoUDP, "sctp": ProtoSCTP, "icmp": ProtoICMP}[protoName]
	port, _ := strconv.Atoi(portStr)
	srcID, srcIP, srcPod := w.end(from, res)
	dstID, dstIP, dstPod := w.end(to, res)
	if srcPod {
		f := Flow{Local: srcID, Isolation: res.Isolation[srcID], Dir: Egress, Remote: dstID,
			RemoteCIDR: res.CIDRIdentity(dstIP), Proto: proto, Port: uint16(port)}
		if !tbl.Allowed(f) {
			return false
		}
	}
	if dstPod {
		f := Flow{Local: dstID, Isolation: res.Isolation[dstID], Dir: Ingress, Remote: srcID,
			RemoteCIDR: res.CIDRIdentity(srcIP), Proto: proto, Port: uint16(port)}
		if !tbl.Allowed(f) {
			return false
		}
	}
	return true
}

func mustPolicies(t *testing.T, docs ...string) []*networkingv1.NetworkPolicy {
	t.Helper()
	var out []*networkingv1.NetworkPolicy
	for _, d := range docs {
		np := &networkingv1.NetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(d), np); err != nil {
			t.Fatalf("bad test policy: %v\n%s", err, d)
		}
		out = append(out, np)
	}
	return out
}

// Policy snippets, mostly taken from the shapes in the Kubernetes docs.
const (
	denyIngressA = `
metadata: {name: default-deny-ingress, namespace: a}
spec: {podSelector: {}, policyTypes: [Ingress]}`
	denyEgressA = `
metadata: {name: default-deny-egress, namespace: a}
spec: {podSelector: {}, policyTypes: [Egress]}`
)

func TestCompileSemantics(t *testing.T) {
	cases := []struct {
		name     string
		policies []string
		allow    []string
		deny     []string
	}{
		{
			name:  "no policy allows everything",
			allow: []string{"a/x>a/y tcp/80", "b/z>a/x udp/81", "a/x>203.0.113.9 tcp/443", "203.0.113.9>c/z tcp/80"},
		},
		{
			name:     "default deny ingress isolates only ingress of selected namespace",
			policies: []string{denyIngressA},
			allow:    []string{"a/x>b/y tcp/80", "b/x>b/y tcp/80", "a/x>203.0.113.9 udp/53"},
			deny:     []string{"a/x>a/y tcp/80", "b/x>a/y udp/81", "203.0.113.9>a/z tcp/80"},
		},
		{
			name:     "traffic from the node is always allowed",
			policies: []string{denyIngressA},
			allow:    []string{"node>a/x tcp/80", "node>a/y udp/81"},
		},
		{
			name: "allow all ingress with an empty rule",
			policies: []string{`
metadata: {name: allow-all-ingress, namespace: a}
spec: {podSelector: {}, ingress: [{}], policyTypes: [Ingress]}`, denyIngressA},
			allow: []string{"b/x>a/y tcp/80", "203.0.113.9>a/z udp/1234"},
		},
		{
			name:     "default deny egress",
			policies: []string{denyEgressA},
			allow:    []string{"b/x>a/x tcp/80"},
			deny:     []string{"a/x>b/x tcp/80", "a/x>a/y udp/81", "a/x>203.0.113.9 tcp/443"},
		},
		{
			name:     "egress to the node is subject to policy",
			policies: []string{denyEgressA},
			deny:     []string{"a/x>node tcp/10250"},
		},
		{
			name: "allow all egress with an empty rule",
			policies: []string{denyEgressA, `
metadata: {name: allow-all-egress, namespace: a}
spec: {podSelector: {}, egress: [{}], policyTypes: [Egress]}`},
			allow: []string{"a/x>b/x tcp/80", "a/x>203.0.113.9 tcp/443"},
		},
		{
			name: "deny all ingress and egress",
			policies: []string{`
metadata: {name: default-deny-all, namespace: a}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}`},
			deny: []string{"a/x>a/y tcp/80", "a/x>b/y tcp/80", "b/x>a/y tcp/80"},
		},
		{
			name: "podSelector peer selects pods in the policy namespace",
			policies: []string{`
metadata: {name: allow-x, namespace: a}
spec:
  podSelector: {matchLabels: {pod: "y"}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: x}}}]}]`},
			allow: []string{"a/x>a/y tcp/80", "a/y>a/x tcp/80", "b/z>a/z tcp/80"},
			deny:  []string{"a/z>a/y tcp/80", "b/x>a/y tcp/80", "203.0.113.9>a/y tcp/80"},
		},
		{
			name: "namespaceSelector peer selects all pods of matching namespaces",
			policies: []string{`
metadata: {name: allow-ns-b, namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: b}}}]}]`},
			allow: []string{"b/x>a/y tcp/80", "b/z>a/x udp/81"},
			deny:  []string{"a/x>a/y tcp/80", "c/x>a/y tcp/80"},
		},
		{
			name: "namespaceSelector and podSelector in one peer are ANDed",
			policies: []string{`
metadata: {name: and, namespace: a}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: b}}
      podSelector: {matchLabels: {pod: x}}`},
			allow: []string{"b/x>a/y tcp/80"},
			deny:  []string{"b/y>a/y tcp/80", "c/x>a/y tcp/80", "a/x>a/y tcp/80"},
		},
		{
			name: "namespaceSelector and podSelector as two peers are ORed",
			policies: []string{`
metadata: {name: or, namespace: a}
spec:
  podSelector: {}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {ns: b}}
    - podSelector: {matchLabels: {pod: x}}`},
			allow: []string{"b/y>a/y tcp/80", "a/x>a/y tcp/80"},
			deny:  []string{"c/x>a/y tcp/80", "a/z>a/y tcp/80"},
		},
		{
			name: "empty namespaceSelector selects pods of all namespaces, not external",
			policies: []string{`
metadata: {name: all-ns, namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {}}]}]`},
			allow: []string{"b/x>a/y tcp/80", "c/z>a/x udp/81", "a/z>a/y tcp/80"},
			deny:  []string{"203.0.113.9>a/y tcp/80"},
		},
		{
			name: "namespaceSelector by the automatic name label",
			policies: []string{`
metadata: {name: by-name, namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: c}}}]}]`},
			allow: []string{"c/x>a/y tcp/80"},
			deny:  []string{"b/x>a/y tcp/80"},
		},
		{
			name: "matchExpressions In, NotIn and Exists",
			policies: []string{`
metadata: {name: expr, namespace: a}
spec:
  podSelector: {matchExpressions: [{key: pod, operator: In, values: [x, "y"]}]}
  ingress:
  - from:
    - namespaceSelector: {matchExpressions: [{key: ns, operator: NotIn, values: [c]}]}
      podSelector: {matchExpressions: [{key: pod, operator: Exists}]}`},
			allow: []string{"b/z>a/x tcp/80", "a/z>a/y tcp/80", "c/x>a/z tcp/80"},
			deny:  []string{"c/x>a/x tcp/80", "203.0.113.9>a/y tcp/80"},
		},
		{
			name: "ipBlock allows external addresses in the block",
			policies: []string{`
metadata: {name: cidr, namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 192.0.2.0/24}}]}]`},
			allow: []string{"192.0.2.5>a/x tcp/80"},
			deny:  []string{"198.51.100.1>a/x tcp/80", "b/x>a/x tcp/80"},
		},
		{
			name: "ipBlock except carves addresses out",
			policies: []string{`
metadata: {name: cidr-except, namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 192.0.2.0/24, except: [192.0.2.0/28]}}]}]`},
			allow: []string{"192.0.2.100>a/x tcp/80", "192.0.2.16>a/x tcp/80"},
			deny:  []string{"192.0.2.5>a/x tcp/80", "192.0.2.15>a/x tcp/80"},
		},
		{
			name: "ipBlock except in one policy does not hide the range another policy allows",
			policies: []string{`
metadata: {name: cidr-except, namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 192.0.2.0/24, except: [192.0.2.0/28]}}]}]`, `
metadata: {name: cidr-small, namespace: a}
spec:
  podSelector: {matchLabels: {pod: x}}
  ingress: [{from: [{ipBlock: {cidr: 192.0.2.0/30}}]}]`},
			allow: []string{"192.0.2.1>a/x tcp/80", "192.0.2.100>a/y tcp/80"},
			deny:  []string{"192.0.2.1>a/y tcp/80", "192.0.2.5>a/x tcp/80"},
		},
		{
			name: "egress ipBlock with except also matches pod addresses",
			policies: []string{`
metadata: {name: egress-cidr, namespace: a}
spec:
  podSelector: {matchLabels: {pod: x}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 10.0.1.0/24, except: [10.0.1.2/32]}}]}]`},
			allow: []string{"a/x>a/z tcp/80", "a/x>10.0.1.3 udp/81"},
			deny:  []string{"a/x>a/y tcp/80", "a/x>b/x tcp/80", "a/x>203.0.113.9 tcp/80"},
		},
		{
			name: "ipBlock covering the node address",
			policies: []string{denyEgressA, `
metadata: {name: to-node, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 192.168.255.0/24}}]}]`},
			allow: []string{"a/x>node tcp/10250"},
			deny:  []string{"a/x>b/x tcp/80"},
		},
		{
			name: "IPv6 ::/0 does not match IPv4",
			policies: []string{`
metadata: {name: v6, namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: "::/0"}}]}]`},
			allow: []string{"2001:db8::1>a/x tcp/80"},
			deny:  []string{"192.0.2.1>a/x tcp/80"},
		},
		{
			name: "numeric port defaults to TCP",
			policies: []string{`
metadata: {name: port80, namespace: a}
spec:
  podSelector: {}
  ingress: [{ports: [{port: 80}]}]`},
			allow: []string{"b/x>a/y tcp/80", "203.0.113.9>a/y tcp/80"},
			deny:  []string{"b/x>a/y tcp/81", "b/x>a/y udp/80", "b/x>a/y sctp/80"},
		},
		{
			name: "UDP and SCTP ports",
			policies: []string{`
metadata: {name: udp-sctp, namespace: a}
spec:
  podSelector: {}
  ingress: [{ports: [{protocol: UDP, port: 81}, {protocol: SCTP, port: 80}]}]`},
			allow: []string{"b/x>a/y udp/81", "b/x>a/y sctp/80"},
			deny:  []string{"b/x>a/y tcp/81", "b/x>a/y udp/80", "b/x>a/y sctp/81"},
		},
		{
			name: "endPort range",
			policies: []string{`
metadata: {name: range, namespace: a}
spec:
  podSelector: {}
  ingress: [{ports: [{protocol: TCP, port: 80, endPort: 1000}]}]`},
			allow: []string{"b/x>a/y tcp/80", "b/x>a/y tcp/81", "b/x>a/y tcp/512", "b/x>a/y tcp/1000"},
			deny:  []string{"b/x>a/y tcp/79", "b/x>a/y tcp/1001", "b/x>a/y udp/81"},
		},
		{
			name: "protocol without port allows all its ports",
			policies: []string{`
metadata: {name: all-udp, namespace: a}
spec:
  podSelector: {}
  ingress: [{ports: [{protocol: UDP}]}]`},
			allow: []string{"b/x>a/y udp/1", "b/x>a/y udp/65535"},
			deny:  []string{"b/x>a/y tcp/80", "b/x>a/y icmp/0"},
		},
		{
			name: "peers and ports in one rule are ANDed",
			policies: []string{`
metadata: {name: peer-port, namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{podSelector: {matchLabels: {pod: x}}}], ports: [{port: 80}]}]`},
			allow: []string{"a/x>a/y tcp/80"},
			deny:  []string{"a/x>a/y tcp/81", "a/z>a/y tcp/80"},
		},
		{
			name: "rules of one policy are ORed",
			policies: []string{`
metadata: {name: two-rules, namespace: a}
spec:
  podSelector: {}
  ingress:
  - {from: [{podSelector: {matchLabels: {pod: x}}}], ports: [{port: 80}]}
  - {from: [{podSelector: {matchLabels: {pod: "y"}}}], ports: [{port: 81}]}`},
			allow: []string{"a/x>a/z tcp/80", "a/y>a/z tcp/81"},
			deny:  []string{"a/x>a/z tcp/81", "a/y>a/z tcp/80"},
		},
		{
			name: "policies are additive",
			policies: []string{`
metadata: {name: p1, namespace: a}
spec:
  podSelector: {matchLabels: {pod: z}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: x}}}]}]`, `
metadata: {name: p2, namespace: a}
spec:
  podSelector: {matchLabels: {pod: z}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: c}}}], ports: [{port: 81, protocol: UDP}]}]`},
			allow: []string{"a/x>a/z tcp/80", "c/y>a/z udp/81"},
			deny:  []string{"c/y>a/z tcp/80", "a/y>a/z tcp/80"},
		},
		{
			name: "a policy only selects pods of its own namespace",
			policies: []string{`
metadata: {name: deny-b, namespace: b}
spec: {podSelector: {}, policyTypes: [Ingress]}`},
			allow: []string{"a/x>a/y tcp/80", "c/x>a/y tcp/80"},
			deny:  []string{"a/x>b/y tcp/80"},
		},
		{
			name: "policyTypes default adds Egress when egress rules exist and always Ingress",
			policies: []string{`
metadata: {name: implicit, namespace: a}
spec:
  podSelector: {matchLabels: {pod: x}}
  egress: [{to: [{namespaceSelector: {matchLabels: {ns: b}}}]}]`},
			allow: []string{"a/x>b/y tcp/80"},
			deny:  []string{"a/x>c/y tcp/80", "b/x>a/x tcp/80"},
		},
		{
			name: "explicit policyTypes Egress leaves ingress open despite ingress rules",
			policies: []string{`
metadata: {name: egress-only, namespace: a}
spec:
  podSelector: {matchLabels: {pod: x}}
  policyTypes: [Egress]
  ingress: [{from: [{podSelector: {matchLabels: {pod: nobody}}}]}]`},
			allow: []string{"b/x>a/x tcp/80"},
			deny:  []string{"a/x>b/x tcp/80"},
		},
		{
			name: "rule without ports allows every protocol, with ports only those",
			policies: []string{`
metadata: {name: icmp, namespace: a}
spec:
  podSelector: {matchLabels: {pod: x}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: b}}}]}, {ports: [{port: 80}]}]`},
			allow: []string{"b/x>a/x icmp/0", "c/x>a/x tcp/80"},
			deny:  []string{"c/x>a/x icmp/0"},
		},
		{
			name: "named port no pod defines matches nothing",
			policies: []string{`
metadata: {name: named, namespace: a}
spec:
  podSelector: {}
  ingress: [{ports: [{port: http}]}]`},
			deny: []string{"b/x>a/y tcp/80"},
		},
		{
			name: "egress allowed to selected namespaces only",
			policies: []string{`
metadata: {name: egress-ns, namespace: a}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {matchLabels: {ns: c}}}], ports: [{port: 53, protocol: UDP}]}]`},
			allow: []string{"a/x>c/y udp/53"},
			deny:  []string{"a/x>c/y tcp/53", "a/x>b/y udp/53", "a/x>203.0.113.9 udp/53"},
		},
		{
			name: "both ends isolated: need egress at source and ingress at destination",
			policies: []string{denyEgressA, `
metadata: {name: b-deny, namespace: b}
spec: {podSelector: {}, policyTypes: [Ingress]}`, `
metadata: {name: a-to-b, namespace: a}
spec:
  podSelector: {matchLabels: {pod: x}}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {matchLabels: {ns: b}}}]}]`, `
metadata: {name: b-from-a, namespace: b}
spec:
  podSelector: {matchLabels: {pod: "y"}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: a}}}]}]`},
			allow: []string{"a/x>b/y tcp/80"},
			deny:  []string{"a/x>b/z tcp/80", "a/y>b/y tcp/80"},
		},
	}
	if len(cases) < 25 {
		t.Fatalf("only %d cases", len(cases))
	}
	w := newWorld()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Compile(w.input(mustPolicies(t, tc.policies...)), identity.NewCIDRs())
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			tbl := res.Table()
			for _, c := range tc.allow {
				if !w.reachable(t, res, tbl, c) {
					t.Errorf("%s denied, want allowed", c)
				}
			}
			for _, c := range tc.deny {
				if w.reachable(t, res, tbl, c) {
					t.Errorf("%s allowed, want denied", c)
				}
			}
		})
	}
}

func TestCompileSkipsInvalidPolicyOnly(t *testing.T) {
	w := newWorld()
	nps := mustPolicies(t, denyIngressA, `
metadata: {name: bad, namespace: b}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]`)
	res, err := Compile(w.input(nps), identity.NewCIDRs())
	if err == nil || !strings.Contains(err.Error(), "b/bad") || !strings.Contains(err.Error(), "spec.ingress[0].from[0].ipBlock.except[0]") {
		t.Fatalf("error = %v, want one naming b/bad and the except field", err)
	}
	if !res.Isolation[w.ids["a/x"].ID].Has(Ingress) {
		t.Fatal("valid policy was not applied")
	}
	if res.Isolation[w.ids["b/x"].ID] != 0 {
		t.Fatal("invalid policy was applied")
	}
}

func TestPortPrefixesCoverExactly(t *testing.T) {
	ranges := [][2]uint16{{80, 80}, {80, 81}, {0, 65535}, {1, 65535}, {1024, 2047}, {1000, 1999}, {65535, 65535}, {3, 60000}}
	for _, r := range ranges {
		rule := Rule{Local: 300, Remote: 400, Dir: Ingress, Proto: ProtoTCP, PortLo: r[0], PortHi: r[1]}
		keys := rule.Keys()
		if len(keys) > 32 {
			t.Errorf("range %v expands to %d keys", r, len(keys))
		}
		tbl := Table{}
		for _, k := range keys {
			tbl[k] = struct{}{}
		}
		for p := 0; p <= 65535; p++ {
			want := uint16(p) >= r[0] && uint16(p) <= r[1]
			if got := tbl.Match(300, 400, Ingress, ProtoTCP, uint16(p)); got != want {
				t.Fatalf("range %v port %d: match=%v want %v", r, p, got, want)
			}
		}
		if tbl.Match(300, 400, Ingress, ProtoUDP, r[0]) || tbl.Match(300, 401, Ingress, ProtoTCP, r[0]) {
			t.Fatalf("range %v matched another protocol or remote", r)
		}
	}
}

func TestCIDRIdentityLongestPrefix(t *testing.T) {
	w := newWorld()
	res, err := Compile(w.input(mustPolicies(t, `
metadata: {name: c, namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}, {ipBlock: {cidr: 10.1.2.0/24}}]}]`)), identity.NewCIDRs())
	if err != nil {
		t.Fatal(err)
	}
	for addr, prefix := range map[string]string{"10.9.9.9": "10.0.0.0/8", "10.1.9.9": "10.1.0.0/16", "10.1.2.3": "10.1.2.0/24"} {
		if got, want := res.CIDRIdentity(netip.MustParseAddr(addr)), res.CIDRs[netip.MustParsePrefix(prefix)]; got != want {
			t.Errorf("CIDRIdentity(%s) = %v, want %v (%s)", addr, got, want, prefix)
		}
	}
	if got := res.CIDRIdentity(netip.MustParseAddr("8.8.8.8")); got != identity.World {
		t.Errorf("unknown address resolved to %v", got)
	}
}

func BenchmarkCompile10kRules(b *testing.B) {
	w := newWorld()
	var nps []*networkingv1.NetworkPolicy
	for i := range 10000 {
		nps = append(nps, mustPoliciesB(b, fmt.Sprintf(`
metadata: {name: p%d, namespace: a}
spec:
  podSelector: {matchLabels: {pod: x}}
  ingress: [{from: [{podSelector: {matchLabels: {pod: "y"}}}], ports: [{port: %d}]}]`, i, 1+i%65535))...)
	}
	in := w.input(nps)
	b.ResetTimer()
	for b.Loop() {
		if _, err := Compile(in, identity.NewCIDRs()); err != nil {
			b.Fatal(err)
		}
	}
}

func mustPoliciesB(b *testing.B, doc string) []*networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{}
	if err := yaml.Unmarshal([]byte(doc), np); err != nil {
		b.Fatal(err)
	}
	return []*networkingv1.NetworkPolicy{np}
}
