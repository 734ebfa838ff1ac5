package multinode

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	"github.com/coordino/coordino/controller"
	"github.com/coordino/coordino/test/apiserver"
	"github.com/coordino/coordino/test/harness"
)

// kubeEnv is the real API server and the controller (in-process, blocks
// from Node.spec.podCIDRs) of a Kubernetes-mode cluster.
type kubeEnv struct {
	srv  *apiserver.Server
	kube kubernetes.Interface
	crd  versioned.Interface
	ns   string // the namespace test pods live in
}

// newKubeCluster is newCluster in Kubernetes mode: every daemon gets its
// blocks, peers, identities and policy from the API server; nothing is
// distributed by files.
func newKubeCluster(t *testing.T, m mode, count int) *cluster {
	t.Helper()
	c := newUnderlay(t, m)
	c.kube = startKube(t)
	for i := 0; i < count; i++ {
		c.addNode()
	}
	for _, n := range c.nodes {
		c.startDaemon(n)
	}
	return c
}

// startKube starts the API server and the controller a Kubernetes-mode
// cluster's nodes join.
func startKube(t *testing.T) *kubeEnv {
	t.Helper()
	srv := apiserver.Start(t)
	env := &kubeEnv{srv: srv, kube: kubernetes.NewForConfigOrDie(srv.Config), crd: versioned.NewForConfigOrDie(srv.Config),
		ns: "team-" + harness.RandomSuffix(6)}
	ctx := bg(t)
	for _, name := range []string{"coordino-system", env.ns} {
		if _, err := env.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// No controller-manager makes the default service account here.
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
		if _, err := env.kube.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	opts := controller.DefaultOptions()
	opts.LeaderElect, opts.IPAM, opts.MetricsAddr, opts.Workers = false, controller.IPAMKubernetes, "127.0.0.1:0", 2
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- controller.Run(cctx, srv.Config, opts, zap.NewNop()) }()
	t.Cleanup(func() { cancel(); <-done })
	return env
}

func bg(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// join points n's daemon at the API server (through a proxy into its
// netns) and creates its Node, as kubelet would, with its blocks as
// spec.podCIDRs.
func (k *kubeEnv) join(t *testing.T, n *node) {
	t.Helper()
	proxy := harness.NewAPIProxy(t, n.NS, harness.APIHostPort(k.srv.Config))
	n.Kubeconfig = filepath.Join(n.Dir, "kubeconfig")
	harness.WriteKubeconfig(t, k.srv.Config, proxy.Addr, n.Kubeconfig)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
	for _, b := range n.blocks() {
		node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, b.String())
	}
	node.Spec.PodCIDR = node.Spec.PodCIDRs[0]
	if _, err := k.kube.CoreV1().Nodes().Create(bg(t), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The controller copies the blocks into the NodeConfig; a daemon that
	// starts before would serve its first ADDs without blocks.
	if err := eventually(15*time.Second, func() error {
		nc, err := k.crd.CoordinoV1alpha1().NodeConfigs().Get(bg(t), n.Name, metav1.GetOptions{})
		if err == nil && len(nc.Spec.Blocks) != len(node.Spec.PodCIDRs) {
			err = fmt.Errorf("NodeConfig %s has blocks %v", n.Name, nc.Spec.Blocks)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// addKubePod creates the Pod object (bound to n, as the scheduler would)
// and then runs ADD, as kubelet would, and serves the name server on both
// families.
func (c *cluster) addKubePod(n *node, labels map[string]string) *pod {
	c.t.Helper()
	name := fmt.Sprintf("pod-%s-%s", n.Name, harness.RandomSuffix(5))
	no := false
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.kube.ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: n.Name, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/pause",
				Ports: []corev1.ContainerPort{{Name: "names", ContainerPort: namePort, Protocol: corev1.ProtocolTCP}}}}}}
	if _, err := c.kube.kube.CoreV1().Pods(c.kube.ns).Create(bg(c.t), obj, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	hp, err := harness.NewPod(name)
	if err != nil {
		c.t.Fatal(err)
	}
	p := c.attach(n, hp, harness.RuntimeConfIn(hp, "eth0", c.kube.ns))
	for _, a := range p.addrs {
		stop, err := harness.Serve(p.NS, a, namePort, p.Name)
		if err != nil {
			c.t.Fatal(err)
		}
		c.t.Cleanup(stop)
	}
	return p
}

// deleteKubePod runs DEL and deletes the Pod object.
func (c *cluster) deleteKubePod(p *pod) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.node.cni.Del(ctx, harness.RuntimeConfIn(p.Pod, "eth0", c.kube.ns)); err != nil {
		c.t.Fatalf("DEL %s: %v", p.Name, err)
	}
	p.node.pods = slices.DeleteFunc(p.node.pods, func(q *pod) bool { return q == p })
	p.Close()
	if err := c.kube.kube.CoreV1().Pods(c.kube.ns).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// published returns the addresses n's NodeEndpoints lists.
func (c *cluster) published(n *node) (map[netip.Addr]int32, error) {
	ne, err := c.kube.crd.CoordinoV1alpha1().NodeEndpoints().Get(bg(c.t), n.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	out := map[netip.Addr]int32{}
	for _, e := range ne.Spec.Endpoints {
		for _, s := range e.Addresses {
			out[netip.MustParseAddr(s)] = e.Identity
		}
	}
	return out, nil
}

// denied checks that from cannot reach target over either family, several
// times over a second (a denied SYN is dropped: each try times out).
func denied(from *pod, target *pod) error {
	for i := 0; i < 3; i++ {
		for _, v6 := range []bool{false, true} {
			if got, err := dialName(from.NS, target.addr(v6), 300*time.Millisecond); err == nil {
				return fmt.Errorf("%s reached %s at %v (answered %q)", from.Name, target.Name, target.addr(v6), got)
			}
		}
	}
	return nil
}

// allowed waits until from reaches target over both families.
func allowed(from *pod, target *pod, within time.Duration) error {
	for _, v6 := range []bool{false, true} {
		if err := eventually(within, func() error {
			got, err := dialName(from.NS, target.addr(v6), 300*time.Millisecond)
			if err == nil && got != target.Name {
				err = fmt.Errorf("answered by %q", got)
			}
			return err
		}); err != nil {
			return fmt.Errorf("%s -> %s at %v: %w", from.Name, target.Name, target.addr(v6), err)
		}
	}
	return nil
}

// addWebForClients starts an app=web pod on n with a NetworkPolicy that
// isolates it for ingress and allows pods labelled role=client, whichever
// node they run on.
func (c *cluster) addWebForClients(n *node) *pod {
	c.t.Helper()
	web := c.addKubePod(n, map[string]string{"app": "web"})
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "web-from-clients", Namespace: c.kube.ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
				{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "client"}}}}}},
		}}
	if _, err := c.kube.kube.NetworkingV1().NetworkPolicies(c.kube.ns).Create(bg(c.t), np, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	return web
}

// knowsRemote waits until n's daemon knows at least want remote pod
// addresses.
func knowsRemote(n *node, want float64, within time.Duration) error {
	return eventually(within, func() error {
		if v, err := n.Metric("coordino_remote_endpoints"); err != nil || v < want {
			return fmt.Errorf("%s knows %v remote endpoints, want %v: %v", n.Name, v, want, err)
		}
		return nil
	})
}

// TestKubernetesModeRemoteIdentities runs three nodes in Kubernetes mode
// against the real API server and controller: peers come from NodeConfigs
// (a joining node becomes reachable), a NetworkPolicy on one node allows
// and denies pods of other nodes by their labels (remote identities from
// NodeEndpoints), and a deleted pod's or node's addresses stop matching
// their identity. On the code before NodeEndpoints and the NodeConfig peer
// source, cross-node traffic had no routes in Kubernetes mode and remote
// pods resolved to "world", so every allow below failed.
func TestKubernetesModeRemoteIdentities(t *testing.T) {
	start := time.Now()
	c := newKubeCluster(t, direct, 2)
	n0, n1 := c.nodes[0], c.nodes[1]
	web := c.addWebForClients(n0)
	other := c.addKubePod(n1, map[string]string{"role": "other"})
	client := c.addKubePod(n1, map[string]string{"role": "client"})

	t.Run("remote-pod-allowed-by-labels", func(t *testing.T) {
		if err := allowed(client, web, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("new-remote-pod-latency", func(t *testing.T) {
		// Routes are up: what remains is the identity crossing (controller
		// allocation, move from the temporary identity, NodeEndpoints
		// write, watch, ipcache). A label set seen before has its
		// Identity already; a new one waits for the controller.
		for _, lbls := range []map[string]string{{"role": "client"}, {"role": "client", "tier": "new"}} {
			p := c.addKubePod(n1, lbls)
			added := time.Now()
			if err := allowed(p, web, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			t.Logf("new remote pod %v allowed by labels %v after its ADD returned", lbls, time.Since(added).Round(10*time.Millisecond))
			c.deleteKubePod(p)
		}
	})
	t.Run("remote-pod-denied-by-labels", func(t *testing.T) {
		// Known with its identity first, so the denial is the policy's,
		// not an address the node has not heard of yet.
		if err := eventually(20*time.Second, func() error {
			pub, err := c.published(n1)
			if err != nil {
				return err
			}
			for _, a := range other.addrs {
				if pub[a] == 0 {
					return fmt.Errorf("%v not published (have %v)", a, pub)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := knowsRemote(n0, 4, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := denied(other, web); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("joining-node-reachable-from-nodeconfig", func(t *testing.T) {
		n2 := c.addNode()
		c.startDaemon(n2)
		joiner := c.addKubePod(n2, map[string]string{"role": "client"})
		if err := allowed(joiner, web, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := allowed(web, joiner, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("deleted-pod-vanishes", func(t *testing.T) {
		gone := client.addrs
		c.deleteKubePod(client)
		if err := eventually(10*time.Second, func() error {
			pub, err := c.published(n1)
			if err != nil {
				return err
			}
			for _, a := range gone {
				if _, ok := pub[a]; ok {
					return fmt.Errorf("%v still published", a)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := eventually(10*time.Second, func() error {
			v, err := n0.Metric("coordino_remote_endpoints")
			if err != nil || v != 4 { // other (node1) and the joiner (node2), two families each
				return fmt.Errorf("node0 knows %v remote endpoints, want 4: %v", v, err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("deleted-node-vanishes", func(t *testing.T) {
		n2 := c.nodes[2]
		joiner := n2.pods[0]
		// Before: published, and allowed by its label.
		if pub, err := c.published(n2); err != nil || pub[joiner.addr(false)] == 0 {
			t.Fatalf("node2's NodeEndpoints does not list %v: %v %v", joiner.addr(false), pub, err)
		}
		if err := allowed(joiner, web, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		// The node goes away with its daemon; its pods' netns stay here
		// (a node that vanished does not run DEL).
		if err := n2.StopDaemon(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := c.kube.kube.CoreV1().Nodes().Delete(bg(t), n2.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := eventually(15*time.Second, func() error {
			_, err := c.kube.crd.CoordinoV1alpha1().NodeEndpoints().Get(bg(t), n2.Name, metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return fmt.Errorf("NodeEndpoints of the deleted node: %v", err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		// Its pod's addresses no longer carry the client identity on node0
		// (the routes stay until its blocks are reclaimed): denied.
		if err := eventually(10*time.Second, func() error { return denied(joiner, web) }); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("TestKubernetesModeRemoteIdentities: %v", time.Since(start).Round(time.Millisecond))
}

// TestKubernetesModeWireGuard: under encryption the daemons find each
// other's public keys in NodeConfig status (published by each daemon, never
// distributed by hand) and pods talk across nodes over both families.
func TestKubernetesModeWireGuard(t *testing.T) {
	start := time.Now()
	c := newKubeCluster(t, wgUser, 2)
	a, b := c.addKubePod(c.nodes[0], map[string]string{"app": "a"}), c.addKubePod(c.nodes[1], map[string]string{"app": "b"})
	for _, n := range c.nodes {
		nc, err := c.kube.crd.CoordinoV1alpha1().NodeConfigs().Get(bg(t), n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := eventually(15*time.Second, func() error {
			nc, err = c.kube.crd.CoordinoV1alpha1().NodeConfigs().Get(bg(t), n.Name, metav1.GetOptions{})
			if err != nil || nc.Status.WireGuard == nil {
				return fmt.Errorf("%s: no status.wireGuard yet (%v)", n.Name, err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if want := n.address(false).String() + ":51871"; nc.Status.WireGuard.Endpoint != want {
			t.Errorf("%s publishes endpoint %q, want %q", n.Name, nc.Status.WireGuard.Endpoint, want)
		}
	}
	if err := allowed(a, b, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := allowed(b, a, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("TestKubernetesModeWireGuard: %v", time.Since(start).Round(time.Millisecond))
}
