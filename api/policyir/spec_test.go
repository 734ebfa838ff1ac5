package policyir

import (
	"encoding/json"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// TestCompileSpec checks the published shape: defaults explicit, CIDRs
// canonical, ports as ranges, and that FromSpec reads it back.
func TestCompileSpec(t *testing.T) {
	np := &networkingv1.NetworkPolicy{}
	doc := `{metadata: {name: p, namespace: ns}, spec: {podSelector: {matchLabels: {app: db}},
  ingress: [{from: [{namespaceSelector: {matchLabels: {team: a}}}, {ipBlock: {cidr: 10.1.2.3/16, except: [10.1.5.0/24]}}],
             ports: [{port: 80, endPort: 90}, {protocol: UDP}, {port: http}]}],
  egress: [{}]}}`
	if err := yaml.Unmarshal([]byte(doc), np); err != nil {
		t.Fatal(err)
	}
	spec, err := Compile(np)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(spec.PolicyTypes, ","); got != "Ingress,Egress" {
		t.Errorf("policyTypes = %s, want Ingress,Egress", got)
	}
	if len(spec.Rules) != 2 || spec.Rules[0].Direction != "Ingress" || spec.Rules[1].Direction != "Egress" {
		t.Fatalf("rules = %+v, want one ingress then one egress", spec.Rules)
	}
	in := spec.Rules[0]
	if in.Peers[0].PodSelector == nil || len(in.Peers[0].PodSelector.MatchLabels) != 0 {
		t.Errorf("namespace-only peer: podSelector = %v, want empty (all pods)", in.Peers[0].PodSelector)
	}
	if b := in.Peers[1].IPBlock; b == nil || b.CIDR != "10.1.0.0/16" || b.Except[0] != "10.1.5.0/24" {
		t.Errorf("ipBlock = %+v, want canonical 10.1.0.0/16 except 10.1.5.0/24", b)
	}
	want := []coordinov1alpha1.PolicyPortRange{{Protocol: 6, First: 80, Last: 90}, {Protocol: 17, First: 0, Last: 65535}}
	if len(in.Ports) != 2 || in.Ports[0] != want[0] || in.Ports[1] != want[1] {
		t.Errorf("ports = %+v, want %+v", in.Ports, want)
	}
	if len(in.NamedPorts) != 1 || in.NamedPorts[0] != (coordinov1alpha1.PolicyNamedPort{Protocol: 6, Name: "http"}) || len(spec.Warnings) != 0 {
		t.Errorf("named ports = %+v, warnings %q; want TCP http and no warning", in.NamedPorts, spec.Warnings)
	}
	p, err := FromSpec("ns", "p", spec)
	if err != nil {
		t.Fatal(err)
	}
	if !p.IsolatesIngress || !p.IsolatesEgress || len(p.Rules) != 2 || !p.PodSelector.Matches(labels.Set{"app": "db"}) {
		t.Errorf("FromSpec = %+v", p)
	}
	if len(p.Rules[0].NamedPorts) != 1 || p.Rules[0].NamedPorts[0] != (NamedPort{Protocol: ProtoTCP, Name: "http"}) {
		t.Errorf("FromSpec named ports = %+v, want TCP http", p.Rules[0].NamedPorts)
	}
	if p.Rules[0].Peers[0].NamespaceSelector == nil || !p.Rules[0].Peers[0].PodSelector.Empty() {
		t.Errorf("peer = %+v, want namespace selector and all pods", p.Rules[0].Peers[0])
	}
}

func TestFromSpecNames(t *testing.T) {
	cases := map[string]string{
		"spec.podSelector":                         `{podSelector: {matchExpressions: [{key: a, operator: Bogus}]}, policyTypes: []}`,
		"spec.policyTypes[0]":                      `{podSelector: {}, policyTypes: [Sideways]}`,
		"spec.rules[0].direction":                  `{podSelector: {}, policyTypes: [Ingress], rules: [{direction: Up}]}`,
		"spec.rules[0].peers[0].podSelector":       `{podSelector: {}, policyTypes: [Ingress], rules: [{direction: Ingress, peers: [{}]}]}`,
		"spec.rules[0].peers[0].ipBlock.except[0]": `{podSelector: {}, policyTypes: [Ingress], rules: [{direction: Ingress, peers: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]}`,
		"spec.rules[0].ports[0]":                   `{podSelector: {}, policyTypes: [Egress], rules: [{direction: Egress, ports: [{protocol: 6, first: 90, last: 80}]}]}`,
		"spec.rules[0].ports[0].protocol":          `{podSelector: {}, policyTypes: [Egress], rules: [{direction: Egress, ports: [{protocol: 1, first: 0, last: 1}]}]}`,
		"spec.rules[0].namedPorts[0].name":         `{podSelector: {}, policyTypes: [Egress], rules: [{direction: Egress, namedPorts: [{protocol: 6, name: "no such"}]}]}`,
		"spec.rules[0].namedPorts[0].protocol":     `{podSelector: {}, policyTypes: [Egress], rules: [{direction: Egress, namedPorts: [{protocol: 1, name: http}]}]}`,
	}
	for field, doc := range cases {
		spec := &coordinov1alpha1.PolicyIRSpec{}
		if err := yaml.Unmarshal([]byte(doc), spec); err != nil {
			t.Fatalf("%s: %v", field, err)
		}
		_, err := FromSpec("ns", "p", spec)
		if err == nil || !strings.Contains(err.Error(), "policyir ns/p: "+field+":") {
			t.Errorf("FromSpec %s = %v, want error on %s", doc, err, field)
		}
	}
}

// FuzzFromSpec: a PolicyIR object from the API server is untrusted input;
// FromSpec must return an error or a Policy, never panic.
func FuzzFromSpec(f *testing.F) {
	f.Add(`{"podSelector":{},"policyTypes":["Ingress"],"rules":[{"direction":"Ingress","peers":[{"podSelector":{"matchLabels":{"a":"b"}}}],"ports":[{"protocol":6,"first":80,"last":80}]}]}`)
	f.Add(`{"podSelector":{},"policyTypes":["Egress"],"rules":[{"direction":"Egress","peers":[{"ipBlock":{"cidr":"::/0","except":["::1/128"]}}]}]}`)
	f.Add(`{"podSelector":{},"policyTypes":["Ingress"],"rules":[{"direction":"Ingress","namedPorts":[{"protocol":6,"name":"http"}]}]}`)
	f.Add(`{"podSelector":{"matchExpressions":[{"key":"k","operator":"In","values":["v"]}]},"policyTypes":[]}`)
	f.Fuzz(func(t *testing.T, doc string) {
		spec := &coordinov1alpha1.PolicyIRSpec{}
		if json.Unmarshal([]byte(doc), spec) != nil {
			return
		}
		p, err := FromSpec("ns", "p", spec)
		if err == nil && p == nil {
			t.Fatal("nil policy without error")
		}
	})
}
