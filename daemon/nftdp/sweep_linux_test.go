package nftdp

import (
	"maps"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/coordino/coordino/daemon/policy"
)

// holdSweeps keeps the sweep's timer from firing during the test.
func holdSweeps(t *testing.T, delay time.Duration) {
	old := sweepDelay
	sweepDelay = delay
	t.Cleanup(func() { sweepDelay = old })
}

// endpointObjects are the chains of ep's interface.
func (c *cluster) endpointObjects(name string) []object {
	var out []object
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		out = append(out, object{name: endpointChain(c.eps[name].HostIfName, dir)})
	}
	return out
}

func (c *cluster) tableObjects() map[object]struct{} {
	c.t.Helper()
	c.dp.mu.Lock()
	defer c.dp.mu.Unlock()
	have, err := c.dp.objects()
	if err != nil {
		c.t.Fatal(err)
	}
	return have
}

// TestDetachLeavesDeletionToTheSweep: a detach's transaction deletes no
// chain or set (the kernel would hold it for an RCU grace period): it
// takes away the elements that reach the endpoint's chains, and the sweep
// deletes the chains and sets of several detaches in one transaction once
// the table is quiet.
func TestDetachLeavesDeletionToTheSweep(t *testing.T) {
	holdSweeps(t, time.Second)
	c := newCluster(t, false)
	c.policies(serverFromClientsOn80) // the client and server identities get maps
	ids := c.dp.LocalIdentities()
	sweeps := c.dp.stats.sweeps
	var gone []object
	for _, name := range []string{"a", "b", "c"} {
		start := time.Now()
		if err := c.dp.DetachEndpoint(c.eps[name]); err != nil {
			t.Fatal(err)
		}
		t.Logf("detach of %s: %s", name, time.Since(start).Round(time.Microsecond))
		have := c.tableObjects()
		for _, o := range c.endpointObjects(name) {
			if _, ok := have[o]; !ok {
				t.Errorf("the detach of %s deleted chain %s in its own transaction", name, o.name)
			}
			gone = append(gone, o)
		}
	}
	for _, name := range []string{"a", "b", "c"} {
		for _, s := range localSets(c.dp.lay.table, ids[c.eps[name].Key], policy.Ingress) {
			gone = append(gone, object{set: true, name: s.Name})
		}
	}
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		// Unreachable from the moment the detaches returned.
		elems, err := c.dp.conn.GetSetElements(&nftables.Set{Table: c.dp.lay.table, Name: epsSet(dir), IsMap: true})
		if err != nil || len(elems) > 0 {
			t.Errorf("eps-%s holds %d elements (%v) with every endpoint detached", dirName(dir), len(elems), err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.dp.mu.Lock()
		n, swept := c.dp.stats.sweeps-sweeps, len(c.dp.doomed) == 0
		c.dp.mu.Unlock()
		if swept {
			if n != 1 {
				t.Errorf("%d sweeps, want the three detaches' objects deleted in one", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no sweep 10 s after the last detach")
		}
		time.Sleep(20 * time.Millisecond)
	}
	have := c.tableObjects()
	for _, o := range gone {
		if _, ok := have[o]; ok {
			t.Errorf("%+v left after the sweep", o)
		}
	}
}

// TestReusedAddressJudgedByNewPod: a pod re-created at once with the old
// pod's address and interface (the doomed chains taken back) is judged by
// its own policy from its first packet, both as the destination and as a
// peer, whether that is more open or more closed than the old pod's.
func TestReusedAddressJudgedByNewPod(t *testing.T) {
	holdSweeps(t, time.Hour)
	c := newCluster(t, false)
	clientFromServer := policyDoc("client", "default", `  podSelector: {matchLabels: {app: client}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: server}}}]
    ports: [{port: 80}]
`)
	denyBatch := policyDoc("batch", "default", `  podSelector: {matchLabels: {app: batch}}
  policyTypes: [Ingress]
`)
	c.policies(serverFromClientsOn80, clientFromServer, denyBatch)
	c.expect(true, "a>b tcp/80", "b>a tcp/80")
	c.expect(false, "c>b tcp/80")
	reattach := func(labels map[string]string) {
		t.Helper()
		if err := c.dp.DetachEndpoint(c.eps["b"]); err != nil {
			t.Fatal(err)
		}
		ep := c.eps["b"]
		ep.Key += "-new"
		ep.Labels = labels
		if err := c.dp.AttachEndpoint(ep); err != nil {
			t.Fatal(err)
		}
		c.eps["b"] = ep
	}
	// More closed: no ingress at all, and not a server to a's policy.
	reattach(map[string]string{"app": "batch"})
	c.expect(false, "a>b tcp/80", "b>a tcp/80", "c>b tcp/80")
	// More open: selected by no policy.
	reattach(map[string]string{"app": "web"})
	c.expect(true, "a>b tcp/80", "a>b tcp/81", "c>b tcp/80")
	c.expect(false, "b>a tcp/80")
	// The server again: the old identity's objects taken back whole.
	reattach(map[string]string{"app": "server"})
	c.expect(true, "a>b tcp/80", "b>a tcp/80")
	c.expect(false, "c>b tcp/80", "a>b tcp/81")
	c.sweep()
	c.expect(true, "a>b tcp/80", "b>a tcp/80")
	c.expect(false, "c>b tcp/80", "a>b tcp/81")
}

// TestRestartDoomsOrphans: a daemon killed before its sweep leaves
// unreferenced chains and sets; the next start dooms the same objects
// (endpoint chains at Open, the rest at the first snapshot) and sweeps
// them.
func TestRestartDoomsOrphans(t *testing.T) {
	holdSweeps(t, time.Hour)
	c := newCluster(t, false)
	c.policies(serverFromClientsOn80)
	if err := c.dp.DetachEndpoint(c.eps["b"]); err != nil {
		t.Fatal(err)
	}
	c.dp.mu.Lock()
	left := maps.Clone(c.dp.doomed)
	c.dp.mu.Unlock()
	if len(left) < 2+8+2 { // b's two chains, the server identity's maps and chains
		t.Fatalf("doomed %v, want b's chains and its identity's maps", left)
	}
	c.dp.Close() // the sweep never runs: a kill
	c.open()
	c.dp.mu.Lock()
	for _, o := range c.endpointObjects("b") {
		if _, ok := c.dp.doomed[o]; !ok {
			t.Errorf("Open did not doom the orphaned chain %s", o.name)
		}
	}
	c.dp.mu.Unlock()
	c.policies(serverFromClientsOn80)
	c.dp.mu.Lock()
	if !maps.Equal(c.dp.doomed, left) {
		t.Errorf("doomed after restart %v, want %v", c.dp.doomed, left)
	}
	c.dp.mu.Unlock()
	c.expect(true, "a>c tcp/80")
	c.sweep()
	have := c.tableObjects()
	for o := range left {
		if _, ok := have[o]; ok {
			t.Errorf("%+v left after the sweep", o)
		}
	}
}

// TestRefusedSweepKeepsPolicy: a sweep the kernel refuses changes nothing
// in force, is counted, and deletes everything when tried again.
func TestRefusedSweepKeepsPolicy(t *testing.T) {
	holdSweeps(t, time.Hour)
	c := newCluster(t, false)
	c.policies(serverFromClientsOn80)
	if err := c.dp.DetachEndpoint(c.eps["c"]); err != nil {
		t.Fatal(err)
	}
	testFailTransaction = func() bool { return true }
	t.Cleanup(func() { testFailTransaction = nil })
	c.dp.mu.Lock()
	doomed := maps.Clone(c.dp.doomed)
	err := c.dp.sweep()
	failed, kept := c.dp.stats.sweepFailures, maps.Equal(doomed, c.dp.doomed)
	c.dp.mu.Unlock()
	testFailTransaction = nil
	if err == nil || failed != 1 || !kept {
		t.Fatalf("refused sweep: error %v, %d failures counted, doomed kept %v", err, failed, kept)
	}
	c.expect(true, "a>b tcp/80")
	c.expect(false, "a>b tcp/81")
	c.sweep()
	c.expect(true, "a>b tcp/80")
	c.expect(false, "a>b tcp/81")
}
