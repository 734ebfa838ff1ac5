package nftdp

import "testing"

func TestDefaultAllowThenIsolation(t *testing.T) {
	c := newCluster(t, false)
	c.expect(true, "a>b tcp/80", "c>b udp/81", "ext>b tcp/80", "node>b tcp/80", "b>ext tcp/80")
	c.policies(policyDoc("server", "default", `  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 80}]
`))
	c.expect(true, "a>b tcp/80", "node>b tcp/81", "b>a tcp/80", "b>ext tcp/81")
	c.expect(false, "a>b tcp/81", "a>b udp/80", "c>b tcp/80", "ext>b tcp/80")
	c.policies()
	c.expect(true, "a>b tcp/81", "c>b tcp/80")
}
