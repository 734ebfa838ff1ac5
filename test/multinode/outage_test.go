package multinode

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// TestKubernetesModeRestartDuringAPIOutage: a daemon restarted while the
// API server is down keeps the identities of remote pods in its ipcache
// (it has not heard anything from the API that would remove them), so
// cross-node traffic a policy allows by labels keeps flowing, and what it
// denies stays denied; once the API server is back, the remote view is
// the live one again. On the code before remote endpoints were restored
// from the pinned ipcache, the restart's first flush deleted them and the
// client resolved to "world": denied.
func TestKubernetesModeRestartDuringAPIOutage(t *testing.T) {
	start := time.Now()
	c := newKubeCluster(t, direct, 2)
	n0, n1 := c.nodes[0], c.nodes[1]
	web := c.addWebForClients(n0)
	client := c.addKubePod(n1, map[string]string{"role": "client"})
	other := c.addKubePod(n1, map[string]string{"role": "other"})
	if err := allowed(client, web, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := knowsRemote(n0, 4, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := denied(other, web); err != nil {
		t.Fatal(err)
	}
	// Let node0 save its last-known state with the policy in it.
	time.Sleep(3 * time.Second)

	c.kube.srv.StopAPIServer()
	if err := n0.StopDaemon(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := n0.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	if err := eventually(15*time.Second, func() error {
		if !n0.LogContains("serving from the last-known cluster state") {
			return fmt.Errorf("node0 does not serve from its last-known state yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// New connections every ~0.3 s for a few seconds: the restarted
	// daemon's first flush has run by now, and nothing may have removed
	// the client's identity.
	for i := 0; i < 10; i++ {
		for _, v6 := range []bool{false, true} {
			if _, err := dialName(client.NS, web.addr(v6), time.Second); err != nil {
				t.Fatalf("round %d: %s -> %s at %v after the restart during the outage: %v", i, client.Name, web.Name, web.addr(v6), err)
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	if err := denied(other, web); err != nil {
		t.Fatalf("during the outage: %v", err)
	}

	if err := c.kube.srv.StartAPIServer(bg(t)); err != nil {
		t.Fatal(err)
	}
	if err := eventually(30*time.Second, func() error {
		if v, err := n0.Metric("coordino_k8s_live"); err != nil || v != 1 {
			return fmt.Errorf("node0 not live again: %v %v", v, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Live again: a pod started now is learnt, the others keep their
	// verdicts.
	late := c.addKubePod(n1, map[string]string{"role": "client"})
	if err := allowed(late, web, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := allowed(client, web, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := denied(other, web); err != nil {
		t.Fatalf("after the outage: %v", err)
	}
	t.Logf("TestKubernetesModeRestartDuringAPIOutage: %v", time.Since(start).Round(time.Millisecond))
}
