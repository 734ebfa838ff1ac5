package multinode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coordino/coordino/test/harness"
)

// benchPolicyFillers is how many extra policies the policy-loaded bench
// run adds: each selects every pod of the namespace (the test pods too)
// and allows ingress from one /24 on one port, so the test pods carry a
// few hundred allow rules that their own traffic does not match.
const benchPolicyFillers = 300

// benchPolicyArgs gives every daemon of the bench a policy dir (empty
// until benchPolicySet is written).
func benchPolicyArgs(t *testing.T) func(dir string) []string {
	return func(dir string) []string {
		if err := os.MkdirAll(filepath.Join(dir, "policies"), 0o700); err != nil {
			t.Fatal(err)
		}
		args := []string{"--policy-dir", filepath.Join(dir, "policies")}
		// bpf (the default) or legacy: the same-run A/B of host routing.
		if v := os.Getenv("COORDINO_BENCH_HOST_ROUTING"); v != "" {
			args = append(args, "--host-routing", v)
		}
		return args
	}
}

// benchPolicySet is the realistic set the policy-loaded rows run under:
// the pods of "default" are isolated both ways and allowed to and from
// the pod blocks on the bench's ports only (ipBlock: standalone mode has
// no remote pod identities), next to benchPolicyFillers policies on other
// prefixes and ports, and a default-deny in benchPolicyFillers/10 other
// namespaces.
func benchPolicySet() []byte {
	var b strings.Builder
	ports := `
    ports:
    - protocol: TCP
      port: 5200
      endPort: 5299
    - protocol: TCP
      port: ` + fmt.Sprint(echoPort+1)
	fmt.Fprintf(&b, `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bench-pods-in, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
  - from:
    - ipBlock: {cidr: 10.10.0.0/16}
    - ipBlock: {cidr: "fd00:10::/32"}%s
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: bench-pods-out, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
  - to:
    - ipBlock: {cidr: 10.10.0.0/16}
    - ipBlock: {cidr: "fd00:10::/32"}%s
`, ports, ports)
	for i := 0; i < benchPolicyFillers; i++ {
		fmt.Fprintf(&b, `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: filler-%d, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
  - from:
    - ipBlock: {cidr: 172.%d.%d.0/24}
    ports:
    - {protocol: TCP, port: %d}
`, i, 16+i/256, i%256, 10000+i)
	}
	for i := 0; i < benchPolicyFillers/10; i++ {
		fmt.Fprintf(&b, `---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: default-deny, namespace: team-%d}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
`, i)
	}
	return []byte(b.String())
}

// loadBenchPolicy writes benchPolicySet to every node, waits until each
// daemon loaded it, and checks that it is in force: src no longer reaches
// a port of dst the set does not allow.
func loadBenchPolicy(t *testing.T, c *cluster, src, dst *pod) {
	t.Helper()
	data := benchPolicySet()
	for _, n := range c.nodes {
		if err := n.WritePolicy(filepath.Join(n.Dir, "policies"), "bench.yaml", data, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	stop, err := harness.Serve(dst.NS, dst.addr(false), namePort, dst.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if got, err := dialName(src.NS, dst.addr(false), 500*time.Millisecond); err == nil {
		t.Fatalf("policy set not in force: %s reached %s on port %d (answered %q)", src.Name, dst.Name, namePort, got)
	}
}
