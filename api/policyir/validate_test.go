package policyir

import (
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

func TestValidateNames(t *testing.T) {
	cases := map[string]string{
		"spec.policyTypes[0]":               `{metadata: {name: p}, spec: {podSelector: {}, policyTypes: [Sideways]}}`,
		"spec.ingress[0].ports[0].protocol": `{metadata: {name: p}, spec: {podSelector: {}, ingress: [{ports: [{protocol: ICMP}]}]}}`,
		"spec.ingress[0].ports[0].endPort":  `{metadata: {name: p}, spec: {podSelector: {}, ingress: [{ports: [{port: 90, endPort: 80}]}]}}`,
		"spec.egress[0].ports[0].port":      `{metadata: {name: p}, spec: {podSelector: {}, egress: [{ports: [{port: 70000}]}]}}`,
		"spec.ingress[0].from[0]":           `{metadata: {name: p}, spec: {podSelector: {}, ingress: [{from: [{}]}]}}`,
		"spec.egress[0].to[0].ipBlock.cidr": `{metadata: {name: p}, spec: {podSelector: {}, egress: [{to: [{ipBlock: {cidr: 300.0.0.0/8}}]}]}}`,
		"spec.podSelector":                  `{metadata: {name: p}, spec: {podSelector: {matchExpressions: [{key: a, operator: Bogus}]}}}`,
		"metadata.name":                     `{spec: {podSelector: {}}}`,
	}
	for field, doc := range cases {
		np := &networkingv1.NetworkPolicy{}
		if err := yaml.Unmarshal([]byte(doc), np); err != nil {
			t.Fatalf("%s: %v", field, err)
		}
		err := ValidateNetworkPolicy(np)
		if err == nil || !strings.HasPrefix(err.Error(), field+":") {
			t.Errorf("validate %s = %v, want error on %s", doc, err, field)
		}
	}
}
