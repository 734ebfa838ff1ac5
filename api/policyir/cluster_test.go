package policyir

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	cnpv1beta1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	"sigs.k8s.io/yaml"
)

func parseCluster(t *testing.T, doc string) *cnpv1beta1.ClusterNetworkPolicy {
	t.Helper()
	cnp := &cnpv1beta1.ClusterNetworkPolicy{}
	if err := yaml.UnmarshalStrict([]byte(doc), cnp); err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	return cnp
}

// TestNormalizeCluster checks the normalized form: tier, priority, subject
// selectors, rule actions and indexes, peers and ports.
func TestNormalizeCluster(t *testing.T) {
	p, err := NormalizeCluster(parseCluster(t, `metadata: {name: c}
spec:
  tier: Baseline
  priority: 7
  subject: {pods: {namespaceSelector: {matchLabels: {env: prod}}, podSelector: {matchLabels: {app: db}}}}
  ingress:
  - {action: Accept, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 5432}}}, {destinationNamedPort: metrics}]}
  egress:
  - {action: Pass, to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: web}}}}]}
  - {action: Deny, to: [{networks: [10.0.0.0/8, "fd00::/8"]}], protocols: [{udp: {destinationPort: {range: {start: 1000, end: 2000}}}}, {sctp: {}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Tier != TierBaseline || p.Priority != 7 || !p.Cluster() || p.Key() != "/c" || p.Object() != "ClusterNetworkPolicy/c" {
		t.Errorf("policy = %+v", p)
	}
	if !p.NamespaceSelector.Matches(labels.Set{"env": "prod"}) || p.NamespaceSelector.Matches(labels.Set{}) || !p.PodSelector.Matches(labels.Set{"app": "db"}) {
		t.Errorf("subject = %v / %v", p.NamespaceSelector, p.PodSelector)
	}
	if len(p.Rules) != 3 {
		t.Fatalf("rules = %+v", p.Rules)
	}
	in, pass, deny := p.Rules[0], p.Rules[1], p.Rules[2]
	if in.Direction != Ingress || in.Action != ActionAccept || in.Index != 0 || !in.Peers[0].PodSelector.Empty() ||
		len(in.Ports) != 1 || in.Ports[0] != (PortRange{ProtoTCP, 5432, 5432}) || in.NamedPorts[0] != (NamedPort{ProtoAny, "metrics"}) {
		t.Errorf("ingress rule = %+v", in)
	}
	if pass.Direction != Egress || pass.Action != ActionPass || pass.Index != 0 || !pass.AllTraffic() {
		t.Errorf("pass rule = %+v", pass)
	}
	if deny.Action != ActionDeny || deny.Index != 1 || len(deny.Peers) != 2 || deny.Peers[1].Block.CIDR.String() != "fd00::/8" ||
		deny.Ports[0] != (PortRange{ProtoUDP, 1000, 2000}) || deny.Ports[1] != (PortRange{ProtoSCTP, 0, 65535}) {
		t.Errorf("deny rule = %+v", deny)
	}
	if p.Rank(&deny) != 7*25+1 {
		t.Errorf("rank = %d", p.Rank(&deny))
	}
}

// TestNormalizeClusterFailsClosed: a peer Coordino does not enforce
// (domainNames) is ignored by an Accept rule and turns a Deny or Pass rule
// into a Deny of every peer, with a warning. A nodes peer is a node
// selector.
func TestNormalizeClusterFailsClosed(t *testing.T) {
	p, err := NormalizeCluster(parseCluster(t, `metadata: {name: c}
spec:
  tier: Admin
  priority: 1
  subject: {namespaces: {}}
  egress:
  - {action: Accept, to: [{domainNames: [example.com]}]}
  - {action: Pass, to: [{domainNames: [example.com]}, {namespaces: {}}]}
  - {action: Deny, to: [{nodes: {matchLabels: {role: infra}}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Rules[0]; !r.NoPorts || r.Action != ActionAccept {
		t.Errorf("accept to domainNames = %+v, want a rule matching nothing", r)
	}
	if r := p.Rules[1]; r.Action != ActionDeny || len(r.Peers) != 0 || r.NoPorts {
		t.Errorf("pass to domainNames = %+v, want deny of every peer", r)
	}
	if r := p.Rules[2]; r.Action != ActionDeny || len(r.Peers) != 1 || r.Peers[0].NodeSelector == nil ||
		r.Peers[0].NodeSelector.String() != "role=infra" {
		t.Errorf("deny to nodes = %+v, want a node selector peer", r)
	}
	if len(p.Warnings) != 2 {
		t.Errorf("warnings = %q", p.Warnings)
	}
}

func TestNormalizeClusterNames(t *testing.T) {
	const ok = `{namespaces: {}}`
	cases := map[string]string{
		"metadata.name": `{spec: {tier: Admin, priority: 1, subject: ` + ok + `}}`,
		"spec.tier":     `{metadata: {name: c}, spec: {tier: Middle, priority: 1, subject: ` + ok + `}}`,
		"spec.priority": `{metadata: {name: c}, spec: {tier: Admin, priority: -1, subject: ` + ok + `}}`,
		"spec.subject":  `{metadata: {name: c}, spec: {tier: Admin, priority: 1, subject: {}}}`,
		"spec.subject.pods.podSelector": `{metadata: {name: c}, spec: {tier: Admin, priority: 1,
			subject: {pods: {namespaceSelector: {}, podSelector: {matchExpressions: [{key: a, operator: Bogus}]}}}}}`,
		"spec.ingress[0].action":           `{metadata: {name: c}, spec: {tier: Admin, priority: 1, subject: ` + ok + `, ingress: [{action: Allow, from: [` + ok + `]}]}}`,
		"spec.ingress[0].from":             `{metadata: {name: c}, spec: {tier: Admin, priority: 1, subject: ` + ok + `, ingress: [{action: Deny, from: []}]}}`,
		"spec.egress[0].to[0]":             `{metadata: {name: c}, spec: {tier: Admin, priority: 1, subject: ` + ok + `, egress: [{action: Deny, to: [{namespaces: {}, networks: [10.0.0.0/8]}]}]}}`,
		"spec.egress[0].to[0].nodes":       `{metadata: {name: c}, spec: {tier: Admin, priority: 1, subject: ` + ok + `, egress: [{action: Deny, to: [{nodes: {matchExpressions: [{key: a, operator: Bogus}]}}]}]}}`,
		"spec.egress[0].to[0].networks[0]": `{metadata: {name: c}, spec: {tier: Admin, priority: 1, subject: ` + ok + `, egress: [{action: Deny, to: [{networks: [10.0.0.1/8]}]}]}}`,
		"spec.egress[0].protocols[0].tcp.destinationPort.range": `{metadata: {name: c}, spec: {tier: Admin, priority: 1, subject: ` + ok + `,
			egress: [{action: Deny, to: [` + ok + `], protocols: [{tcp: {destinationPort: {range: {start: 90, end: 80}}}}]}]}}`,
		"spec.ingress[0].protocols[0].udp.destinationPort.number": `{metadata: {name: c}, spec: {tier: Admin, priority: 1, subject: ` + ok + `,
			ingress: [{action: Deny, from: [` + ok + `], protocols: [{udp: {destinationPort: {number: 70000}}}]}]}}`,
		"spec.ingress[0].protocols[0]": `{metadata: {name: c}, spec: {tier: Admin, priority: 1, subject: ` + ok + `,
			ingress: [{action: Deny, from: [` + ok + `], protocols: [{tcp: {}, udp: {}}]}]}}`,
		"spec.ingress[0].protocols[0].destinationNamedPort": `{metadata: {name: c}, spec: {tier: Admin, priority: 1, subject: ` + ok + `,
			ingress: [{action: Deny, from: [` + ok + `], protocols: [{destinationNamedPort: "no such"}]}]}}`,
	}
	for field, doc := range cases {
		cnp := &cnpv1beta1.ClusterNetworkPolicy{}
		if err := yaml.Unmarshal([]byte(doc), cnp); err != nil {
			t.Fatalf("%s: %v", field, err)
		}
		_, err := NormalizeCluster(cnp)
		if err == nil || !strings.Contains(err.Error(), ": "+field+":") {
			t.Errorf("NormalizeCluster %s = %v, want error on %s", doc, err, field)
		}
	}
}

// FuzzNormalizeCluster: a ClusterNetworkPolicy from the API server or a
// policy file is untrusted input; NormalizeCluster must return an error or
// a Policy whose ranks stay within 15 bits, never panic.
func FuzzNormalizeCluster(f *testing.F) {
	f.Add(`{"metadata":{"name":"c"},"spec":{"tier":"Admin","priority":1000,"subject":{"namespaces":{}},"egress":[{"action":"Deny","to":[{"networks":["::/0"]}],"protocols":[{"sctp":{"destinationPort":{"range":{"start":1,"end":65535}}}}]}]}}`)
	f.Add(`{"metadata":{"name":"c"},"spec":{"tier":"Baseline","priority":0,"subject":{"pods":{"namespaceSelector":{},"podSelector":{}}},"ingress":[{"action":"Pass","from":[{}]}]}}`)
	f.Fuzz(func(t *testing.T, doc string) {
		cnp := &cnpv1beta1.ClusterNetworkPolicy{}
		if yaml.Unmarshal([]byte(doc), cnp) != nil {
			return
		}
		p, err := NormalizeCluster(cnp)
		if err != nil {
			return
		}
		for i := range p.Rules {
			if p.Rank(&p.Rules[i]) > 0x7fff {
				t.Fatalf("rank %d of rule %d exceeds 15 bits", p.Rank(&p.Rules[i]), i)
			}
		}
	})
}
