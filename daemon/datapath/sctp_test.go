package datapath

import (
	"testing"

	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/test/privileged"
)

// TestSCTPPolicy: a policy port with protocol SCTP lets that SCTP port
// through and nothing else, end to end through real associations between
// pod namespaces. Kernels without SCTP skip it; one that ships the sctp
// module but cannot open a socket fails under CI.
func TestSCTPPolicy(t *testing.T) {
	privileged.Require(t)
	if works, claimed := testnet.SCTPSupport(); !works {
		if claimed {
			privileged.Needs(t, "kernel ships SCTP (sctp module or built in) but cannot open an SCTP socket")
		}
		t.Skip("kernel has no SCTP")
	}
	c := newCluster(t, AttachTC)
	c.pods["b"].ServeSCTP(t, 80)
	c.pods["b"].ServeSCTP(t, 81)
	c.expect(true, "a>b sctp/80", "a>b sctp/81", "c>b sctp/80") // b not isolated yet

	c.policies(`
metadata: {name: server-sctp, namespace: default}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{protocol: SCTP, port: 80}]`)
	c.expect(true, "a>b sctp/80")
	c.expect(false, "a>b sctp/81", "a>b tcp/80", "c>b sctp/80")
}
