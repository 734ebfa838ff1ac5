package datapath

import (
	"testing"

	"github.com/coordino/coordino/daemon/policy"
)

const serverHTTP = `
metadata: {name: server-http, namespace: default}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: http}]`

// TestNamedPortsFollowPods: a rule naming a port follows the ports given
// for the pod, whether they come after its endpoint or before, survives a
// daemon restart before anyone feeds them again, and goes when they do.
func TestNamedPortsFollowPods(t *testing.T) {
	c := newCluster(t, AttachTC)
	c.policies(serverHTTP)
	b := c.eps["b"]
	b.Pod = "default/b"
	if err := c.dp.AttachEndpoint(b); err != nil {
		t.Fatal(err)
	}
	c.eps["b"] = b
	c.expect(false, "a>b tcp/80", "a>b tcp/81")

	http80 := []policy.NamedPort{{Name: "http", Protocol: policy.ProtoTCP, Port: 80}}
	if err := c.dp.SetPodNamedPorts("default/b", http80); err != nil {
		t.Fatal(err)
	}
	c.expect(true, "a>b tcp/80")
	c.expect(false, "a>b tcp/81", "c>b tcp/80")
	// Explain names the rule that allows it, resolving the name alike.
	dec, err := c.dp.Decide(b.HostIfIndex, policy.Ingress, c.pods["a"].IP, policy.ProtoTCP, 80)
	if err != nil {
		t.Fatal(err)
	}
	if _, allowedBy := c.dp.Provenance(dec, policy.Ingress, c.pods["a"].IP, policy.ProtoTCP, 80); len(allowedBy) != 1 || allowedBy[0] != "default/server-http spec.ingress[0]" {
		t.Fatalf("provenance of a>b tcp/80: %v, want the named-port rule", allowedBy)
	}

	// Restarted: the endpoint's record still resolves http, also when the
	// endpoint is re-attached before the source has fed the ports again.
	if err := c.dp.Close(); err != nil {
		t.Fatal(err)
	}
	c.open()
	c.policies(serverHTTP)
	c.expect(true, "a>b tcp/80")
	if err := c.dp.AttachEndpoint(b); err != nil {
		t.Fatal(err)
	}
	c.expect(true, "a>b tcp/80")
	c.expect(false, "a>b tcp/81")

	if err := c.dp.SetPodNamedPorts("default/b", nil); err != nil {
		t.Fatal(err)
	}
	c.expect(false, "a>b tcp/80")

	// Ports known before the endpoint attaches.
	if err := c.dp.DetachEndpoint(b); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.SetPodNamedPorts("default/b", []policy.NamedPort{{Name: "http", Protocol: policy.ProtoTCP, Port: 81}}); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.AttachEndpoint(b); err != nil {
		t.Fatal(err)
	}
	c.expect(true, "a>b tcp/81")
	c.expect(false, "a>b tcp/80")
}
