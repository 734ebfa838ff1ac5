package k8smode

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/controller"
	"github.com/coordino/coordino/test/apiserver"
	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// setup starts an API server with a namespace (labelled nsLabels) and a
// Kubernetes-mode node (daemon not started) whose NodeConfig holds block.
func setup(t testing.TB, block string) (*apiserver.Server, *cluster, string, *k8sNode) {
	t.Helper()
	privileged.Require(t)
	if err := harness.RequireBinaries(); err != nil {
		t.Fatal(err)
	}
	srv := apiserver.Start(t)
	c := newCluster(t, srv.Config)
	c.runPolicyCompiler(t)
	ns := "team-" + harness.RandomSuffix(6)
	c.namespace(t, ns, nsLabels)
	node := newK8sNode(t, c)
	c.nodeConfig(t, node.Name, coordinov1alpha1.NodeBlock{CIDR: block, Pool: "test"})
	return srv, c, ns, node
}

// cluster is one API server with clients for the test's fixtures.
type cluster struct {
	cfg  *rest.Config
	kube kubernetes.Interface
	crd  versioned.Interface
}

func newCluster(t testing.TB, cfg *rest.Config) *cluster {
	t.Helper()
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	crd, err := versioned.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{cfg: cfg, kube: kube, crd: crd}
}

// runPolicyCompiler runs the controller's real policy compiler in-process
// until the test ends (the rest of the controller's work is done by
// fixtures here): NetworkPolicies reach the daemon as PolicyIRs.
func (c *cluster) runPolicyCompiler(t testing.TB) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- controller.NewPolicyCompiler(zap.NewNop(), c.kube, c.crd, nil).Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })
}

// networkPolicy creates np and waits until the compiler published its
// PolicyIR, so the daemon can be expected to enforce it.
func (c *cluster) networkPolicy(t testing.TB, np *networkingv1.NetworkPolicy) {
	t.Helper()
	if _, err := c.kube.NetworkingV1().NetworkPolicies(np.Namespace).Create(bg(t), np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the PolicyIR of "+np.Name, func() (bool, string) {
		ir, err := c.crd.CoordinoV1alpha1().PolicyIRs(np.Namespace).Get(bg(t), np.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(ir.Status.Conditions) > 0, fmt.Sprintf("status %+v", ir.Status)
	})
}

func bg(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (c *cluster) namespace(t testing.TB, name string, labels map[string]string) {
	t.Helper()
	ctx := bg(t)
	if _, err := c.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Pods need the namespace's default service account when the
	// ServiceAccount admission plugin is on; no controller-manager runs here.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
	if _, err := c.kube.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// pod creates a Pod object bound to node, as the scheduler would.
func (c *cluster) pod(t testing.TB, ns, name, node string, labels map[string]string) {
	t.Helper()
	no := false
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/pause"}}},
	}
	if _, err := c.kube.CoreV1().Pods(ns).Create(bg(t), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// nodeConfig creates or updates the node's NodeConfig spec (the
// controller's job, done here as a fixture).
func (c *cluster) nodeConfig(t testing.TB, node string, blocks ...coordinov1alpha1.NodeBlock) {
	t.Helper()
	ctx := bg(t)
	ncs := c.crd.CoordinoV1alpha1().NodeConfigs()
	nc, err := ncs.Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = ncs.Create(ctx, &coordinov1alpha1.NodeConfig{ObjectMeta: metav1.ObjectMeta{Name: node},
			Spec: coordinov1alpha1.NodeConfigSpec{Blocks: blocks}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	nc.Spec.Blocks = blocks
	if _, err := ncs.Update(ctx, nc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// identity creates the cluster Identity of a pod label set, as the leader
// controller would: with the namespace's labels as the API server has them
// (it adds kubernetes.io/metadata.name to every namespace).
func (c *cluster) identity(t testing.TB, number int, ns string, podLabels map[string]string) {
	t.Helper()
	nsObj, err := c.kube.CoreV1().Namespaces().Get(bg(t), ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	full := coordinov1alpha1.SecurityLabels(podLabels, nsObj.Labels, coordinov1alpha1.DefaultExcludedLabels)
	obj := &coordinov1alpha1.Identity{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(number),
			Labels: map[string]string{coordinov1alpha1.LabelSetHashLabel: coordinov1alpha1.LabelSetHash(ns, full)}},
		Spec: coordinov1alpha1.IdentitySpec{Namespace: ns, Labels: full},
	}
	if _, err := c.crd.CoordinoV1alpha1().Identities().Create(bg(t), obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// k8sNode is a netns node whose daemon runs in Kubernetes mode, reaching
// the API server through its own proxy.
type k8sNode struct {
	*harness.Node
	proxy *harness.APIProxy
	cni   *harness.CNI
}

func newK8sNode(t testing.TB, c *cluster) *k8sNode {
	t.Helper()
	n, err := harness.NewNode(t.TempDir(), "node-"+harness.RandomSuffix(6), harness.NodeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log tail:\n%s", n.LogTail(80))
		}
		n.Close()
	})
	p := harness.NewAPIProxy(t, n.NS, harness.APIHostPort(c.cfg))
	n.Kubeconfig = filepath.Join(n.Dir, "kubeconfig")
	harness.WriteKubeconfig(t, c.cfg, p.Addr, n.Kubeconfig)
	cni, err := n.NewCNI(n.PrimaryConflist("k8s", "1.1.0"))
	if err != nil {
		t.Fatal(err)
	}
	return &k8sNode{Node: n, proxy: p, cni: cni}
}

// podIn is a pod netns plus its runtime config in namespace ns.
type podIn struct {
	*harness.Pod
	rt   *libcni.RuntimeConf
	addr netip.Addr
}

func (n *k8sNode) add(t testing.TB, ns, name string) *podIn {
	t.Helper()
	p, err := n.tryAdd(t, ns, name)
	if err != nil {
		t.Fatalf("ADD %s/%s: %v", ns, name, err)
	}
	return p
}

func (n *k8sNode) tryAdd(t testing.TB, ns, name string) (*podIn, error) {
	t.Helper()
	hp, err := harness.NewPod(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hp.Close)
	p := &podIn{Pod: hp, rt: harness.RuntimeConfIn(hp, "eth0", ns)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := n.cni.Add(ctx, p.rt)
	if err != nil {
		return nil, err
	}
	addrs, err := harness.Addresses(res)
	if err != nil || len(addrs) == 0 {
		t.Fatalf("ADD %s/%s result: %v %v", ns, name, addrs, err)
	}
	p.addr = addrs[0]
	return p, nil
}

func (n *k8sNode) del(t testing.TB, p *podIn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.cni.Del(ctx, p.rt); err != nil {
		t.Fatalf("DEL %s: %v", p.Name, err)
	}
}

// cniCode returns the CNI error code of err, or 0.
func cniCode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// eventually polls cond until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v (last: %s)", what, timeout, last)
}

func (n *k8sNode) metricIs(t testing.TB, name string, want float64, labels ...string) func() (bool, string) {
	return func() (bool, string) {
		v, err := n.Metric(name, labels...)
		if err != nil {
			return false, err.Error()
		}
		return v == want, fmt.Sprintf("%s = %v, want %v", name, v, want)
	}
}
