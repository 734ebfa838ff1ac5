package k8smode

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/test/harness"
)

const port = 8080

var (
	serverLabels = map[string]string{"app": "server"}
	clientLabels = map[string]string{"app": "client", "pod-template-hash": "5d8f7"} // hash excluded from identities
	otherLabels  = map[string]string{"app": "other"}
	nsLabels     = map[string]string{"team": "a"}
)

// serverIngress isolates app=server for ingress, allowing app=client on TCP 8080.
func serverIngress(ns string) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	p := intstr.FromInt32(port)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "server-ingress", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: serverLabels},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}},
			}},
		},
	}
}

// expect probes TCP from each source to the server and compares outcomes.
func expect(t *testing.T, what string, server *podIn, want map[*podIn]harness.Outcome) {
	t.Helper()
	var probes []harness.Probe
	var order []*podIn
	for from := range want {
		probes = append(probes, harness.Probe{From: from.NS, To: server.addr, Port: port, Proto: "tcp"})
		order = append(order, from)
	}
	got, err := harness.ProbeAll(probes, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i, from := range order {
		if got[i] != want[from] {
			t.Errorf("%s: %s → server: %v, want %v", what, from.Name, got[i], want[from])
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// stream keeps one TCP connection echoing every 20 ms and counts failed
// round trips, so a test can tell whether a change broke it.
type stream struct {
	conn   net.Conn
	ok     atomic.Int64
	failed atomic.Int64
	stop   chan struct{}
	done   chan struct{}
}

func newStream(t *testing.T, from *podIn, to netip.Addr) *stream {
	t.Helper()
	c, err := harness.DialFrom(from.NS, "tcp", to, port, 2*time.Second)
	if err != nil {
		t.Fatalf("open long-lived connection: %v", err)
	}
	s := &stream{conn: c, stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() { c.Close() })
	go func() {
		defer close(s.done)
		buf := make([]byte, 4)
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if s.roundTrip(buf) {
				s.ok.Add(1)
			} else {
				s.failed.Add(1)
			}
		}
	}()
	return s
}

func (s *stream) roundTrip(buf []byte) bool {
	_ = s.conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := s.conn.Write([]byte("ping")); err != nil {
		return false
	}
	_, err := io.ReadFull(s.conn, buf)
	return err == nil
}

// check stops the stream and fails if any round trip failed.
func (s *stream) check(t *testing.T, what string) {
	t.Helper()
	close(s.stop)
	<-s.done
	if s.failed.Load() > 0 || s.ok.Load() == 0 {
		t.Fatalf("%s: long-lived connection broke: %d round trips ok, %d failed", what, s.ok.Load(), s.failed.Load())
	}
	s.ok.Store(0)
	s.stop, s.done = make(chan struct{}), make(chan struct{})
}

// TestKubernetesMode runs one node in Kubernetes mode through the life the
// issue describes, against a real API server, with traffic: labels from Pod
// objects, temporary identities while no controller runs, the move to
// cluster identities under traffic, an API server outage (with a daemon
// restart in the middle of it) and convergence afterwards.
func TestKubernetesMode(t *testing.T) {
	srv, c, ns, node := setup(t, "10.61.0.0/26")
	c.networkPolicy(t, serverIngress(ns))
	// The scheduler's part: Pod objects bound to the node, before their ADD.
	for name, l := range map[string]map[string]string{
		"server": serverLabels, "client": clientLabels, "other": otherLabels, "newcomer": {"app": "client", "tier": "new"},
		"gone": otherLabels, "during-outage": otherLabels, "after-restart": otherLabels,
	} {
		c.pod(t, ns, name, node.Name, l)
	}
	if err := node.StartDaemon(); err != nil {
		t.Fatal(err)
	}

	// Labels come from the Pod objects (the conflist carries none): the
	// policy isolates the server and tells client from other.
	server, client, other := node.add(t, ns, "server"), node.add(t, ns, "client"), node.add(t, ns, "other")
	if !netip.MustParsePrefix("10.61.0.0/26").Contains(server.addr) {
		t.Fatalf("server got %v, not from the NodeConfig block", server.addr)
	}
	stopEcho, err := harness.ServeTCPEcho(server.NS, server.addr, port)
	if err != nil {
		t.Fatal(err)
	}
	defer stopEcho()
	expect(t, "labels from Pod objects", server, map[*podIn]harness.Outcome{client: harness.Reached, other: harness.Blocked})
	// No controller runs: every label set is on a temporary identity.
	eventually(t, 5*time.Second, "three temporary identities", node.metricIs(t, "coordino_identities_temporary", 3))

	// A pod the API server never heard of is refused with "try again later".
	start := time.Now()
	if _, err := node.tryAdd(t, ns, "ghost"); cniCode(err) != 11 {
		t.Fatalf("ADD of a pod without Pod object: %v, want CNI error 11", err)
	}
	t.Logf("ADD of an unknown pod refused after %v", time.Since(start).Round(time.Millisecond))

	t.Run("temporary to cluster identity under traffic", func(t *testing.T) {
		st := newStream(t, client, server.addr)
		time.Sleep(200 * time.Millisecond)
		c.identity(t, 1000, ns, serverLabels)
		c.identity(t, 1001, ns, clientLabels)
		c.identity(t, 1002, ns, otherLabels)
		eventually(t, 10*time.Second, "all endpoints on cluster identities", node.metricIs(t, "coordino_identities_temporary", 0))
		time.Sleep(300 * time.Millisecond)
		st.check(t, "identity switch")
		expect(t, "after the switch", server, map[*podIn]harness.Outcome{client: harness.Reached, other: harness.Blocked})
	})

	t.Run("controller down: new label set on a temporary identity", func(t *testing.T) {
		newcomer := node.add(t, ns, "newcomer")
		eventually(t, 5*time.Second, "newcomer on a temporary identity", node.metricIs(t, "coordino_identities_temporary", 1))
		expect(t, "temporary identity evaluated from its labels", server, map[*podIn]harness.Outcome{newcomer: harness.Reached})
		node.del(t, newcomer)
		eventually(t, 5*time.Second, "temporary identity released", node.metricIs(t, "coordino_identities_temporary", 0))
	})

	gone := node.add(t, ns, "gone")
	// Let the last-known state catch up with every Pod object.
	time.Sleep(3 * time.Second)

	t.Run("API server down", func(t *testing.T) {
		st := newStream(t, client, server.addr)
		srv.StopAPIServer()
		expect(t, "during the outage", server, map[*podIn]harness.Outcome{client: harness.Reached, other: harness.Blocked})
		node.del(t, gone)
		during := node.add(t, ns, "during-outage") // a held block serves it
		expect(t, "ADD during the outage", server, map[*podIn]harness.Outcome{during: harness.Blocked})
		st.check(t, "outage")

		// Restarted while the API server is unreachable: restores from its
		// store, pinned maps and last-known state; flushes nothing.
		st = newStream(t, client, server.addr)
		if err := node.StopDaemon(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := node.StartDaemon(); err != nil {
			t.Fatal(err)
		}
		if !node.LogContains("serving from the last-known cluster state") {
			t.Fatal("restarted daemon did not report serving from the last-known state")
		}
		expect(t, "restarted during the outage", server, map[*podIn]harness.Outcome{client: harness.Reached, other: harness.Blocked, during: harness.Blocked})
		after := node.add(t, ns, "after-restart")
		expect(t, "ADD after the restart", server, map[*podIn]harness.Outcome{after: harness.Blocked})
		st.check(t, "restart during the outage")
		if v, _ := node.Metric("coordino_k8s_live"); v != 0 {
			t.Fatalf("coordino_k8s_live = %v during the outage", v)
		}
	})

	t.Run("reconnect converges", func(t *testing.T) {
		// The API server comes back while this node still cannot reach it,
		// so the test can make changes the node has missed: a block top-up
		// with the first block released, and a pod relabelled.
		node.proxy.Cut()
		if err := srv.StartAPIServer(bg(t)); err != nil {
			t.Fatal(err)
		}
		c.nodeConfig(t, node.Name,
			coordinov1alpha1.NodeBlock{CIDR: "10.61.0.0/26", Pool: "test", Releasing: true},
			coordinov1alpha1.NodeBlock{CIDR: "10.61.0.64/26", Pool: "test"})
		po, err := c.kube.CoreV1().Pods(ns).Get(bg(t), "other", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		po.Labels = map[string]string{"app": "client"}
		if _, err := c.kube.CoreV1().Pods(ns).Update(bg(t), po, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		node.proxy.Restore(t)
		eventually(t, 90*time.Second, "daemon live again", node.metricIs(t, "coordino_k8s_live", 1))
		eventually(t, 30*time.Second, "NodeConfig status reports both blocks at the current generation", func() (bool, string) {
			nc, err := c.crd.CoordinoV1alpha1().NodeConfigs().Get(context.Background(), node.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			st := nc.Status
			if st.ObservedGeneration != nc.Generation || len(st.Blocks) != 2 || st.Blocks[1].Used != 0 || st.Blocks[0].Used == 0 {
				return false, "status " + toJSON(st) + " generation " + toJSON(nc.Generation)
			}
			return len(st.Addresses) > 0, "no addresses"
		})
		next := node.add(t, ns, "newcomer")
		if !netip.MustParsePrefix("10.61.0.64/26").Contains(next.addr) {
			t.Fatalf("ADD after the top-up got %v, want an address of the new block (the old one is releasing)", next.addr)
		}
		eventually(t, 10*time.Second, "relabelled pod allowed", func() (bool, string) {
			got, err := harness.ProbeAll([]harness.Probe{{From: other.NS, To: server.addr, Port: port, Proto: "tcp"}}, time.Second)
			if err != nil {
				return false, err.Error()
			}
			return got[0] == harness.Reached, got[0].String()
		})
	})
}
