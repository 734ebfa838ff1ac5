package nftdp

import (
	"maps"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

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

func isDrop(r *nftables.Rule) bool {
	if len(r.Exprs) != 1 {
		return false
	}
	v, ok := r.Exprs[0].(*expr.Verdict)
	return ok && v.Kind == expr.VerdictDrop
}

// TestDetachLeavesDeletionToTheSweep: a detach's transaction deletes
// nothing (the kernel would hold it for an RCU grace period): it puts a
// drop before its endpoint's rules, and the sweep removes the entries and
// deletes the chains and sets of several detaches in two transactions once
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
				continue
			}
			gone = append(gone, o)
			rules, err := c.dp.conn.GetRules(c.dp.lay.table, &nftables.Chain{Table: c.dp.lay.table, Name: o.name})
			if err != nil || len(rules) == 0 || !isDrop(rules[0]) {
				t.Errorf("chain %s of detached %s does not start with a drop (%v)", o.name, name, err)
			}
		}
	}
	c.expect(false, "ext>a tcp/80", "a>ext tcp/80") // a's veth is still there
	for _, name := range []string{"a", "b", "c"} {
		for _, s := range localSets(c.dp.lay.table, ids[c.eps[name].Key], policy.Ingress) {
			gone = append(gone, object{set: true, name: s.Name})
		}
	}
	if keys, _ := c.dp.Endpoints(); len(keys) > 0 {
		t.Errorf("endpoints %v after detaching all", keys)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.dp.mu.Lock()
		// (The sweep releases mu while the kernel commits.)
		n, swept := c.dp.stats.sweeps-sweeps, len(c.dp.doomed)+len(c.dp.dying) == 0 && !c.dp.committing
		c.dp.mu.Unlock()
		if swept && n > 0 {
			if n != 1 {
				t.Errorf("%d sweeps (%d refused: %+v), want the three detaches' objects deleted in one", n, c.dp.stats.sweepFailures, c.dp.stats)
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
	for _, dir := range []policy.Direction{policy.Ingress, policy.Egress} {
		elems, err := c.dp.conn.GetSetElements(&nftables.Set{Table: c.dp.lay.table, Name: epsSet(dir), IsMap: true})
		if err != nil || len(elems) > 0 {
			t.Errorf("eps-%s holds %d elements (%v) after the sweep", dirName(dir), len(elems), err)
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
// unreferenced chains and sets, and dying endpoints' chains; the next start
// dooms the same objects (endpoint chains no element reaches at Open, the
// rest at the first snapshot), the dying endpoints' too, and sweeps them.
func TestRestartDoomsOrphans(t *testing.T) {
	holdSweeps(t, time.Hour)
	c := newCluster(t, false)
	c.policies(serverFromClientsOn80)
	if err := c.dp.DetachEndpoint(c.eps["b"]); err != nil {
		t.Fatal(err)
	}
	c.finishDetaches()
	if err := c.dp.DetachEndpoint(c.eps["c"]); err != nil { // killed dying
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
	if keys, _ := c.dp.Endpoints(); len(keys) != 1 {
		t.Errorf("adopted %v, want a only", keys)
	}
	c.policies(serverFromClientsOn80)
	c.dp.mu.Lock()
	for _, o := range c.endpointObjects("c") {
		left[o] = struct{}{}
	}
	for o := range left {
		if _, ok := c.dp.doomed[o]; !ok {
			t.Errorf("%+v not doomed after restart", o)
		}
	}
	c.dp.mu.Unlock()
	c.expect(true, "a>ext tcp/80")
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
	c.finishDetaches()
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
