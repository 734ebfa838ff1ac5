package policy

import (
	"fmt"
	"strings"
)

// policyCase is one NetworkPolicy scenario: the documents to load and the
// reachability the Kubernetes documentation says they produce. Truth tables
// are written by hand from the documented semantics, never computed by
// Coordino's own compiler.
type policyCase struct {
	name string
	// policy renders the YAML; it gets the bed for pod addresses (ipBlock).
	policy func(b *bed) string
	want   func() *truth
	// subset marks the representative cases also run in the other modes.
	subset bool
}

// np renders a NetworkPolicy document; spec is YAML at column 0.
func np(ns, name, spec string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: %s\n  namespace: %q\nspec:\n", name, ns)
	for _, l := range strings.Split(strings.Trim(spec, "\n"), "\n") {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

func static(docs ...string) func(*bed) string {
	return func(*bed) string { return strings.Join(docs, "") }
}

// cnp renders a ClusterNetworkPolicy document; spec is YAML at column 0.
func cnp(name, spec string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "---\napiVersion: policy.networking.k8s.io/v1beta1\nkind: ClusterNetworkPolicy\nmetadata:\n  name: %s\nspec:\n", name)
	for _, l := range strings.Split(strings.Trim(spec, "\n"), "\n") {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// Policies reused by several cases.
var (
	denyIngressX = np("x", "deny-ingress", `
podSelector: {}
policyTypes: [Ingress]`)
	denyEgressX = np("x", "deny-egress", `
podSelector: {}
policyTypes: [Egress]`)
	denyAll = func(ns string) string {
		return np(ns, "deny-all", `
podSelector: {}
policyTypes: [Ingress, Egress]`)
	}
	// xaFrom isolates x/a for ingress and allows the given peers.
	xaFrom = func(name, peers string) string {
		return np("x", name, `
podSelector: {matchLabels: {pod: a}}
policyTypes: [Ingress]
ingress:
- from:
`+peers)
	}
	// xaPorts isolates x/a for ingress and allows everyone on the given ports.
	xaPorts = func(name, ports string) string {
		return np("x", name, `
podSelector: {matchLabels: {pod: a}}
policyTypes: [Ingress]
ingress:
- from: [{namespaceSelector: {}}]
  ports:
`+ports)
	}
	xa = pod("x", "a")
)

// cases follow the Kubernetes NetworkPolicy concepts page: isolation,
// the default policies, the peer kinds and their combinations, ports,
// port ranges, protocols and policyTypes, and how policies combine.
var cases = []policyCase{
	{name: "no-policy", policy: static(), want: allow},

	// "Default deny all ingress traffic": an empty podSelector selects every
	// pod of the namespace; no ingress rules means nothing is allowed in.
	{name: "default-deny-ingress", subset: true, policy: static(denyIngressX),
		want: func() *truth { return allow().set(anyPod, inNS("x"), allSvc, false) }},
	// policyTypes omitted: Ingress is implied.
	{name: "default-deny-ingress-implied-type", policy: static(np("x", "deny", `
podSelector: {}`)),
		want: func() *truth { return allow().set(anyPod, inNS("x"), allSvc, false) }},
	// "Allow all ingress traffic" unions with the deny: everything passes.
	{name: "allow-all-ingress", policy: static(denyIngressX, np("x", "allow-all", `
podSelector: {}
ingress:
- {}`)), want: allow},
	// "Default deny all egress traffic".
	{name: "default-deny-egress", subset: true, policy: static(denyEgressX),
		want: func() *truth { return allow().set(inNS("x"), anyPod, allSvc, false) }},
	// "Allow all egress traffic".
	{name: "allow-all-egress", policy: static(denyEgressX, np("x", "allow-all-egress", `
podSelector: {}
policyTypes: [Egress]
egress:
- {}`)), want: allow},
	// "Default deny all ingress and all egress traffic".
	{name: "default-deny-all", policy: static(denyAll("x")),
		want: func() *truth {
			return allow().set(anyPod, inNS("x"), allSvc, false).set(inNS("x"), anyPod, allSvc, false)
		}},
	// Only the pods a policy selects are isolated; a policy selecting no pod does nothing.
	{name: "selector-matching-no-pod", policy: static(np("x", "nobody", `
podSelector: {matchLabels: {pod: d}}
policyTypes: [Ingress, Egress]`)), want: allow},
	// A policy applies in its own namespace only.
	{name: "policy-is-namespaced", policy: static(np("y", "deny-a", `
podSelector: {matchLabels: {pod: a}}
policyTypes: [Ingress]`)),
		want: func() *truth { return allow().set(anyPod, pod("y", "a"), allSvc, false) }},

	// podSelector alone selects pods in the policy's namespace.
	{name: "pod-selector", policy: static(xaFrom("from-b", `  - podSelector: {matchLabels: {pod: b}}`)),
		want: func() *truth { return allow().set(anyPod, xa, allSvc, false).set(pod("x", "b"), xa, allSvc, true) }},
	// Empty podSelector as a peer: every pod of the same namespace.
	{name: "same-namespace-only", policy: static(np("x", "same-ns", `
podSelector: {}
ingress:
- from: [{podSelector: {}}]`)),
		want: func() *truth { return allow().set(not(inNS("x")), inNS("x"), allSvc, false) }},
	// namespaceSelector alone: every pod of the selected namespaces.
	{name: "namespace-selector", policy: static(xaFrom("from-y", `  - namespaceSelector: {matchLabels: {ns: "y"}}`)),
		want: func() *truth { return allow().set(anyPod, xa, allSvc, false).set(inNS("y"), xa, allSvc, true) }},
	// namespaceSelector by the kubernetes.io/metadata.name label every namespace carries.
	{name: "namespace-name-label", policy: static(xaFrom("from-z", `  - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: z}}`)),
		want: func() *truth { return allow().set(anyPod, xa, allSvc, false).set(inNS("z"), xa, allSvc, true) }},
	// Both selectors in ONE peer: pods matching both (AND).
	{name: "namespace-and-pod-one-peer", subset: true, policy: static(xaFrom("y-and-b", `  - namespaceSelector: {matchLabels: {ns: "y"}}
    podSelector: {matchLabels: {pod: b}}`)),
		want: func() *truth { return allow().set(anyPod, xa, allSvc, false).set(pod("y", "b"), xa, allSvc, true) }},
	// The same selectors as TWO peers: either (OR); the podSelector peer is
	// in the policy's own namespace.
	{name: "namespace-or-pod-two-peers", policy: static(xaFrom("y-or-b", `  - namespaceSelector: {matchLabels: {ns: "y"}}
  - podSelector: {matchLabels: {pod: b}}`)),
		want: func() *truth {
			return allow().set(anyPod, xa, allSvc, false).set(or(inNS("y"), pod("x", "b")), xa, allSvc, true)
		}},
	// An empty namespaceSelector with a podSelector: that pod label in every namespace.
	{name: "pod-in-all-namespaces", policy: static(xaFrom("any-ns-b", `  - namespaceSelector: {}
    podSelector: {matchLabels: {pod: b}}`)),
		want: func() *truth { return allow().set(anyPod, xa, allSvc, false).set(labelled("b"), xa, allSvc, true) }},
	// Set-based requirements (matchExpressions) on both selectors.
	{name: "match-expressions", policy: static(xaFrom("expr", `  - namespaceSelector: {matchExpressions: [{key: ns, operator: In, values: ["y", "z"]}]}
    podSelector: {matchExpressions: [{key: pod, operator: NotIn, values: ["c"]}]}`)),
		want: func() *truth {
			return allow().set(anyPod, xa, allSvc, false).
				set(or(pod("y", "a"), pod("y", "b"), pod("z", "a"), pod("z", "b")), xa, allSvc, true)
		}},

	// ipBlock with except, over the pod range: every pod but the excepted two.
	{name: "ipblock-except", subset: true, policy: func(b *bed) string {
		return xaFrom("cidr", fmt.Sprintf(`  - ipBlock: {cidr: %s, except: [%s/32, %s/32]}`,
			b.cidr, b.pod(peer{"y", "b"}).ip, b.pod(peer{"z", "c"}).ip))
	}, want: func() *truth {
		return allow().set(or(pod("y", "b"), pod("z", "c")), xa, allSvc, false)
	}},
	// Egress to a single address.
	{name: "ipblock-egress-host", policy: func(b *bed) string {
		return np("x", "to-ya", fmt.Sprintf(`
podSelector: {matchLabels: {pod: a}}
policyTypes: [Egress]
egress:
- to: [{ipBlock: {cidr: %s/32}}]`, b.pod(peer{"y", "a"}).ip))
	}, want: func() *truth { return allow().set(xa, anyPod, allSvc, false).set(xa, pod("y", "a"), allSvc, true) }},
	// "Everything but the cluster": 0.0.0.0/0 except the pod range reaches no pod.
	{name: "ipblock-world-except-pods", policy: func(b *bed) string {
		return np("x", "world", fmt.Sprintf(`
podSelector: {matchLabels: {pod: a}}
policyTypes: [Egress]
egress:
- to: [{ipBlock: {cidr: 0.0.0.0/0, except: [%s]}}]`, b.cidr))
	}, want: func() *truth { return allow().set(xa, anyPod, allSvc, false) }},
	// An ipBlock outside the pod range isolates without allowing any pod.
	{name: "ipblock-outside-pods", policy: static(xaFrom("doc-net", `  - ipBlock: {cidr: 203.0.113.0/24}`)),
		want: func() *truth { return allow().set(anyPod, xa, allSvc, false) }},

	// Ports: only the listed protocol and port.
	{name: "port-tcp-80", policy: static(xaPorts("tcp80", `  - {protocol: TCP, port: 80}`)),
		want: func() *truth { return allow().set(anyPod, xa, svcNot(tcp(80)), false) }},
	// protocol defaults to TCP.
	{name: "port-default-protocol-tcp", policy: static(xaPorts("p81", `  - port: 81`)),
		want: func() *truth { return allow().set(anyPod, xa, svcNot(tcp(81)), false) }},
	// A rule with ports and no "from" allows every source on those ports.
	{name: "ports-without-peers", policy: static(np("x", "udp80", `
podSelector: {matchLabels: {pod: a}}
ingress:
- ports: [{protocol: UDP, port: 80}]`)),
		want: func() *truth { return allow().set(anyPod, xa, svcNot(udp(80)), false) }},
	// endPort: the range port..endPort inclusive.
	{name: "endport-range", subset: true, policy: static(xaPorts("tcp80-81", `  - {protocol: TCP, port: 80, endPort: 81}`)),
		want: func() *truth { return allow().set(anyPod, xa, proto("udp"), false) }},
	{name: "endport-partial-overlap", policy: static(xaPorts("tcp81-1024", `  - {protocol: TCP, port: 81, endPort: 1024}`)),
		want: func() *truth { return allow().set(anyPod, xa, svcNot(tcp(81)), false) }},
	// protocol without port: every port of that protocol.
	{name: "udp-only", subset: true, policy: static(xaPorts("udp", `  - protocol: UDP`)),
		want: func() *truth { return allow().set(anyPod, xa, proto("tcp"), false) }},
	{name: "udp-81-and-tcp-80", policy: static(xaPorts("mixed", `  - {protocol: UDP, port: 81}
  - {protocol: TCP, port: 80}`)),
		want: func() *truth { return allow().set(anyPod, xa, svcOr(udp(80), tcp(81)), false) }},

	// policyTypes [Egress] only: ingress of the pod stays open.
	{name: "egress-only-policy", policy: static(np("x", "a-to-y", `
podSelector: {matchLabels: {pod: a}}
policyTypes: [Egress]
egress:
- to: [{namespaceSelector: {matchLabels: {ns: "y"}}}]`)),
		want: func() *truth { return allow().set(xa, not(inNS("y")), allSvc, false) }},
	// Egress restricted to one port and protocol (the DNS-style policy).
	{name: "egress-udp-80-only", policy: static(np("x", "udp-out", `
podSelector: {}
policyTypes: [Egress]
egress:
- ports: [{protocol: UDP, port: 80}]`)),
		want: func() *truth { return allow().set(inNS("x"), anyPod, svcNot(udp(80)), false) }},
	// Without policyTypes, a policy with egress rules is Ingress AND Egress:
	// x/a is closed for ingress and may only talk to x/b.
	{name: "implied-types-with-egress-rules", policy: static(np("x", "a-egress", `
podSelector: {matchLabels: {pod: a}}
egress:
- to: [{podSelector: {matchLabels: {pod: b}}}]`)),
		want: func() *truth {
			return allow().set(anyPod, xa, allSvc, false).set(xa, anyPod, allSvc, false).set(xa, pod("x", "b"), allSvc, true)
		}},
	// One policy can isolate ingress and open egress.
	{name: "deny-ingress-allow-egress", policy: static(np("x", "in-deny-out-open", `
podSelector: {}
policyTypes: [Ingress, Egress]
egress:
- {}`)),
		want: func() *truth { return allow().set(anyPod, inNS("x"), allSvc, false) }},

	// Policies are additive: x/a allows the union of two policies' peers.
	{name: "union-of-policies", policy: static(
		xaFrom("from-y", `  - namespaceSelector: {matchLabels: {ns: "y"}}`),
		xaFrom("from-c", `  - podSelector: {matchLabels: {pod: c}}`)),
		want: func() *truth {
			return allow().set(anyPod, xa, allSvc, false).set(or(inNS("y"), pod("x", "c")), xa, allSvc, true)
		}},
	// Both ends must allow: x/b may send only to x/c (its egress), x/a
	// accepts only x/b (its ingress), so x/b→x/a is blocked by x/b's side.
	{name: "both-ends-must-allow", subset: true, policy: static(
		xaFrom("from-b", `  - podSelector: {matchLabels: {pod: b}}`),
		np("x", "b-to-c", `
podSelector: {matchLabels: {pod: b}}
policyTypes: [Egress]
egress:
- to: [{podSelector: {matchLabels: {pod: c}}}]`)),
		want: func() *truth {
			return allow().set(anyPod, xa, allSvc, false).
				set(pod("x", "b"), anyPod, allSvc, false).set(pod("x", "b"), pod("x", "c"), allSvc, true)
		}},
	// Traffic from the node is always allowed, even with everything denied.
	// ClusterNetworkPolicy's tiers around NetworkPolicy (network-policy-api
	// docs): the Admin tier first by ascending priority, Accept and Deny
	// final and Pass handing the flow to NetworkPolicy; the Baseline tier
	// only where no NetworkPolicy isolates the pod.
	{name: "cluster-policy-tiers", policy: static(denyIngressX,
		np("x", "c-from-z", `
podSelector: {matchLabels: {pod: c}}
ingress:
- from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: z}}}]
  ports: [{protocol: TCP, port: 81}]`),
		cnp("accept-y", `
tier: Admin
priority: 10
subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}
ingress:
- action: Accept
  from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: "y"}}}]
  protocols: [{tcp: {destinationPort: {number: 80}}}]`),
		cnp("pass-yb", `
tier: Admin
priority: 5
subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: x}}}
ingress:
- action: Pass
  from: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {pod: b}}}}]`),
		cnp("deny-za", `
tier: Admin
priority: 3
subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {pod: c}}}}
ingress:
- action: Deny
  from: [{pods: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: z}}, podSelector: {matchLabels: {pod: a}}}}]`),
		cnp("xa-no-udp-to-y", `
tier: Admin
priority: 1
subject: {pods: {namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: x}}, podSelector: {matchLabels: {pod: a}}}}
egress:
- action: Deny
  to: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: "y"}}}]
  protocols: [{udp: {}}]`),
		cnp("baseline-no-z", `
tier: Baseline
priority: 1
subject: {namespaces: {}}
ingress:
- action: Deny
  from: [{namespaces: {matchLabels: {kubernetes.io/metadata.name: z}}}]`)),
		want: func() *truth {
			return allow().set(anyPod, inNS("x"), allSvc, false).
				set(inNS("y"), inNS("x"), tcp(80), true).                // Admin Accept
				set(pod("y", "b"), inNS("x"), tcp(80), false).           // Pass ahead of it: NetworkPolicy denies
				set(inNS("z"), pod("x", "c"), tcp(81), true).            // NetworkPolicy allows
				set(pod("z", "a"), pod("x", "c"), allSvc, false).        // Admin Deny ahead of it
				set(inNS("z"), or(inNS("y"), inNS("z")), allSvc, false). // Baseline Deny
				set(pod("x", "a"), inNS("y"), proto("udp"), false)       // Admin Deny of egress
		}},
	{name: "node-to-pod-always-allowed", subset: true, policy: static(denyAll("x"), denyAll("y"), denyAll("z")), want: deny},
}
