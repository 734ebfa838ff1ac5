package controlplane

import (
	"strings"
	"testing"

	"github.com/coordino/coordino/daemon/nodeiso"
)

const validFile = `
# Namespaces carry the labels namespaceSelector matches.
apiVersion: v1
kind: Namespace
metadata: {name: prod, labels: {env: prod}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {env: prod}}}]
    ports: [{port: 80}, {protocol: UDP, port: 5000, endPort: 5100}]
---
`

func TestParseFile(t *testing.T) {
	objs, err := ParseFile("a.yaml", []byte(validFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Namespaces) != 1 || objs.Namespaces[0].Labels["env"] != "prod" {
		t.Fatalf("namespaces = %+v", objs.Namespaces)
	}
	if len(objs.Policies) != 1 || objs.Policies[0].Namespace != "default" || *objs.Policies[0].Spec.Ingress[0].Ports[1].EndPort != 5100 {
		t.Fatalf("policies = %+v", objs.Policies)
	}
	objs, err = ParseFile("j.json", []byte(`{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"x"}}`))
	if err != nil || len(objs.Namespaces) != 1 {
		t.Fatalf("json: %v %+v", err, objs)
	}
}

func TestParseFileErrorsNameFileDocumentAndField(t *testing.T) {
	cases := map[string][]string{
		"apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n": {`"bad.yaml"`, "document 1", `kind "Pod"`},
		"apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelectr: {}}\n": {
			"document 2", `unknown field "podSelectr"`},
		"apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: ns1}\nspec:\n  podSelector: {}\n  egress: [{ports: [{port: 0}]}]\n": {
			"NetworkPolicy ns1/p", "spec.egress[0].ports[0].port"},
		"apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec:\n  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/33}}]}]\n": {
			"spec.ingress[0].from[0].ipBlock.cidr"},
		"apiVersion: v1\nkind: Namespace\nmetadata: {}\n": {"metadata.name"},
		"{{{":                {"document 1"},
		"- just\n- a list\n": {"document 1"},
	}
	for doc, wants := range cases {
		_, err := ParseFile("bad.yaml", []byte(doc))
		if err == nil {
			t.Errorf("ParseFile(%q) succeeded", doc)
			continue
		}
		for _, w := range wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("ParseFile(%q) error %q lacks %q", doc, err, w)
			}
		}
	}
	if _, err := ParseFile("big.yaml", make([]byte, MaxFileSize+1)); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("oversized file: %v", err)
	}
}

func FuzzParseFile(f *testing.F) {
	f.Add([]byte(validFile))
	f.Add([]byte("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec: {podSelector: {matchExpressions: [{key: a, operator: In}]}}"))
	f.Add([]byte("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p}\nspec:\n  podSelector: {}\n  ingress: [{from: [{ipBlock: {cidr: '::/0', except: ['::1/128']}}], ports: [{port: http}]}]"))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte(clusterPolicyDoc))
	f.Add([]byte(nodeDoc + "\n---\n" + strings.Replace(clusterPolicyDoc, "networks: [10.0.0.0/8]", "nodes: {matchLabels: {role: infra}}", 1)))
	f.Add([]byte("apiVersion: coordino.io/v1alpha1\nkind: NodeIsolationPolicy\nmetadata: {name: n}\nspec:\n  podToHost: [{protocol: UDP, port: 53, scope: AllNodes}, {protocol: ICMP, scope: OwnNode}]\n  nodeToNode: [{protocol: TCP, port: 10250, endPort: 10259}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := ParseFile("fuzz.yaml", data)
		if err != nil {
			if !strings.Contains(err.Error(), `"fuzz.yaml"`) {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		// Whatever parses must compile without panicking.
		compileForFuzz(t, objs)
		if _, err := nodeiso.Compile(objs.NodeIsolation, []uint16{51871}); err != nil {
			t.Fatalf("parsed node isolation policy does not compile: %v", err)
		}
	})
}

// TestParseNodeIsolationPolicy: the policy directory takes NodeIsolationPolicy
// documents, and a bad one is rejected with an error naming the field.
func TestParseNodeIsolationPolicy(t *testing.T) {
	objs, err := ParseFile("n.yaml", []byte("apiVersion: coordino.io/v1alpha1\nkind: NodeIsolationPolicy\nmetadata: {name: n}\nspec: {podToHost: [{protocol: UDP, port: 53, scope: AllNodes}]}"))
	if err != nil || len(objs.NodeIsolation) != 1 {
		t.Fatalf("valid policy: %v, %d parsed", err, len(objs.NodeIsolation))
	}
	for doc, field := range map[string]string{
		"spec: {podToHost: [{protocol: GRE, scope: AllNodes}]}":           "spec.podToHost[0].protocol",
		"spec: {nodeToNode: [{protocol: TCP, port: 9, endPort: 8}]}":      "spec.nodeToNode[0].endPort",
		"spec: {podToHost: [{protocol: ICMP, port: 8, scope: OwnNode}]}":  "spec.podToHost[0].port",
		"spec: {policyTypes: [Egress]}":                                   "spec.policyTypes[0]",
		"spec: {podToHost: [{protocol: TCP, port: 53, scope: ThisNode}]}": "spec.podToHost[0].scope",
	} {
		_, err := ParseFile("n.yaml", []byte("apiVersion: coordino.io/v1alpha1\nkind: NodeIsolationPolicy\nmetadata: {name: n}\n"+doc))
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: error %v does not name %s", doc, err, field)
		}
	}
}

const clusterPolicyDoc = `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: deny-tenants}
spec:
  tier: Admin
  priority: 10
  subject: {namespaces: {matchLabels: {tenant: a}}}
  egress:
  - {action: Pass, to: [{namespaces: {matchLabels: {tenant: a}}}]}
  - {action: Deny, to: [{networks: [10.0.0.0/8]}], protocols: [{tcp: {destinationPort: {range: {start: 80, end: 90}}}}]}`

// TestParseClusterNetworkPolicy: the policy directory takes the same
// ClusterNetworkPolicy YAML as the API server, and a bad one is rejected
// with an error naming the field.
func TestParseClusterNetworkPolicy(t *testing.T) {
	objs, err := ParseFile("c.yaml", []byte(clusterPolicyDoc))
	if err != nil || len(objs.ClusterPolicies) != 1 {
		t.Fatalf("valid policy: %v, %d parsed", err, len(objs.ClusterPolicies))
	}
	bad := strings.Replace(clusterPolicyDoc, "priority: 10", "priority: 1001", 1)
	if _, err := ParseFile("c.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), "spec.priority") {
		t.Errorf("priority 1001: %v, want an error naming spec.priority", err)
	}
	bad = strings.Replace(clusterPolicyDoc, "action: Pass", "action: Allow", 1)
	if _, err := ParseFile("c.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), "spec.egress[0].action") {
		t.Errorf("action Allow: %v, want an error naming spec.egress[0].action", err)
	}
}

const nodeDoc = `apiVersion: v1
kind: Node
metadata: {name: infra-1, labels: {role: infra}}
status:
  addresses: [{type: InternalIP, address: 192.0.2.7}, {type: ExternalIP, address: "2001:db8::7"}, {type: Hostname, address: infra-1}]`

// TestParseNode: the policy directory takes v1 Node documents, the labels
// and addresses a ClusterNetworkPolicy's nodes peer selects; a bad address
// is rejected with an error naming the field.
func TestParseNode(t *testing.T) {
	objs, err := ParseFile("n.yaml", []byte(nodeDoc))
	if err != nil || len(objs.Nodes) != 1 || objs.Nodes[0].Labels["role"] != "infra" {
		t.Fatalf("valid node: %v, %+v", err, objs)
	}
	bad := strings.Replace(nodeDoc, "192.0.2.7", "192.0.2.300", 1)
	if _, err := ParseFile("n.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), "status.addresses[0].address") {
		t.Errorf("bad address: %v, want an error naming status.addresses[0].address", err)
	}
	if _, err := ParseFile("n.yaml", []byte("apiVersion: v1\nkind: Node\nmetadata: {}\n")); err == nil || !strings.Contains(err.Error(), "metadata.name") {
		t.Errorf("no name: %v, want an error naming metadata.name", err)
	}
}
