package datapath

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/policy"
)

// Map-update failure tests (a policy map shrunk to 20 entries). Pods: a
// (app=client), b (app=server) in namespace default.

const failClosedMapSize = 20

// clientEgressPorts isolates a's egress, allowing the outside block on n
// ports, 80 and others (n policy entries), and to b on TCP 80 when toServer
// is set.
func clientEgressPorts(n int, toServer bool) string {
	ports := []string{"{port: 80}"}
	for i := range n - 1 {
		ports = append(ports, fmt.Sprintf("{port: %d}", 1000+2*i))
	}
	s := fmt.Sprintf(`
metadata: {name: client-egress, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 203.0.113.0/24}}]
    ports: [%s]`, strings.Join(ports, ", "))
	if toServer {
		s += `
  - to: [{podSelector: {matchLabels: {app: server}}}]
    ports: [{port: 80}]`
	}
	return s
}

// serverFromClient: b's ingress allows a on TCP 80 (one entry).
const serverFromClient = `
metadata: {name: server-from-client, namespace: default}
spec:
  podSelector: {matchLabels: {app: server}}
  ingress: [{from: [{podSelector: {matchLabels: {app: client}}}], ports: [{port: 80}]}]`

// TestMapFullFailsClosed: before, b's ingress is closed and a's egress
// open; the wanted state opens b to a but closes a's egress, so a>b is
// denied before and after. The update does not fit the map. Whatever part
// of it was written, a>b must stay denied: an implementation that writes
// additions first and stops at the first error lets b's new allow in while
// a's isolation is still unset. The scenario repeats, because the order of
// additions may be random.
func TestMapFullFailsClosed(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, MapSizes: MapSizes{Policy: failClosedMapSize}}, false)
	for round := range 3 {
		c.policies(denyServerIngress)
		c.expect(true, "a>ext tcp/81")
		c.expect(false, "a>b tcp/80")
		// 20 entries for a, one for b: one too many.
		err := c.tryPolicies(denyServerIngress, serverFromClient, clientEgressPorts(failClosedMapSize, false))
		if err == nil {
			t.Fatalf("round %d: update of %d entries into a map of %d succeeded", round, failClosedMapSize+1, failClosedMapSize)
		}
		c.expect(false, "a>b tcp/80")
	}
}

// TestMapFullLaterUpdateSucceeds: after an update failed on a full map, a
// smaller one must go through, not fail at the same point again because
// the stale entries are never removed.
func TestMapFullLaterUpdateSucceeds(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, MapSizes: MapSizes{Policy: failClosedMapSize}}, false)
	c.policies(denyServerIngress)
	if err := c.tryPolicies(denyServerIngress, serverFromClient, clientEgressPorts(failClosedMapSize, false)); err == nil {
		t.Fatal("oversized update succeeded")
	}
	// 10 + 1 entries for a, one for b.
	if err := c.tryPolicies(denyServerIngress, serverFromClient, clientEgressPorts(10, true)); err != nil {
		t.Fatalf("update that fits after a failed one: %v", err)
	}
	c.expect(true, "a>b tcp/80", "a>ext tcp/80")
	c.expect(false, "a>b tcp/81", "a>ext tcp/81")
}

// TestMapUpdateRetried: entries the daemon does not own fill the map, so an
// update fails; once they are gone the datapath finishes the update on its
// own, without another call.
func TestMapUpdateRetried(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, MapSizes: MapSizes{Policy: failClosedMapSize}, retryDelay: 50 * time.Millisecond}, false)
	c.policies(denyServerIngress)
	var junk []bpf.CoordinoPolicyKey
	for i := range failClosedMapSize {
		k := policyKey(policy.Key{Prefix: policy.PrefixFull, Local: 0xdead00 + 1, Remote: 0xbeef00, Dir: policy.Ingress, Proto: policy.ProtoTCP, Port: uint16(i + 1)})
		if err := c.dp.objs.CdoPolicy.Update(&k, &bpf.CoordinoPolicyValue{}, ebpf.UpdateNoExist); err != nil {
			t.Fatalf("fill map: %v", err)
		}
		junk = append(junk, k)
	}
	if err := c.tryPolicies(serverFromClient); err == nil {
		t.Fatal("update into a full map succeeded")
	}
	c.expect(false, "a>b tcp/80")
	for i := range junk {
		if err := c.dp.objs.CdoPolicy.Delete(&junk[i]); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.pods["a"].Probe("tcp", c.pods["b"].IP, 80) != nil {
		if time.Now().After(deadline) {
			t.Fatal("failed map update not retried within 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.expect(true, "a>b tcp/80")
	c.expect(false, "a>b tcp/81")
}
