package policy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	typednetworkingv1 "k8s.io/client-go/kubernetes/typed/networking/v1"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/controller"
	"github.com/coordino/coordino/daemon/controlplane"
	"github.com/coordino/coordino/test/apiserver"
	"github.com/coordino/coordino/test/harness"
)

// kubernetesMode runs the daemon in Kubernetes mode against a real
// kube-apiserver: each case's NetworkPolicies are created through the API,
// the controller's policy compiler (in-process) turns them into PolicyIRs,
// and the daemon enforces what it reads from those; pod labels come from Pod
// objects, the block from the node's NodeConfig. A daemon that ignored
// PolicyIRs would leave every pod open and fail every isolating case.
var kubernetesMode = mode{name: "kubernetes", k8s: true, subnet: "10.184.0.0/24"}

// TestKubernetesMode runs the whole matrix through the API, then a policy
// update under traffic and a pod denied from its first packet.
func TestKubernetesMode(t *testing.T) { runKubernetes(t, kubernetesMode) }

// TestKubernetesModeNFTables is the same on --datapath=nftables.
func TestKubernetesModeNFTables(t *testing.T) {
	runKubernetes(t, mode{name: "kubernetes-nftables", k8s: true, nft: true, subnet: "10.185.0.0/24"})
}

func runKubernetes(t *testing.T, m mode) {
	b := newBed(t, m)
	t.Run("matrix", func(t *testing.T) {
		for _, c := range cases {
			// The fixtures here write NetworkPolicies only (apply refuses
			// others): ClusterNetworkPolicy through the API server is
			// test/k8smode's and the bed's conformance suite's.
			if strings.Contains(c.policy(b), "kind: ClusterNetworkPolicy") {
				continue
			}
			t.Run(c.name, func(t *testing.T) { b.runCase(t, c) })
		}
	})
	t.Run("update-under-traffic", func(t *testing.T) { b.updateUnderTraffic(t) })
	t.Run("new-pod-denied-from-first-packet", func(t *testing.T) { b.newPodDenied(t, false) })
}

// bedAPI is the bed's API server and the clients its fixtures use.
type bedAPI struct {
	t    *testing.T
	kube kubernetes.Interface
	crd  versioned.Interface
	node *harness.Node
}

// startAPI starts the API server and the policy compiler, creates the
// matrix namespaces (labelled ns=<name>) and the node's NodeConfig, and
// points the node's daemon at the API server.
func startAPI(t *testing.T, n *harness.Node, block string) *bedAPI {
	t.Helper()
	srv := apiserver.Start(t)
	a := &bedAPI{t: t, node: n}
	var err error
	if a.kube, err = kubernetes.NewForConfig(srv.Config); err != nil {
		t.Fatal(err)
	}
	if a.crd, err = versioned.NewForConfig(srv.Config); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- controller.NewPolicyCompiler(zap.NewNop(), a.kube, a.crd, nil).Run(ctx, 1) }()
	t.Cleanup(func() { cancel(); <-done })

	for _, ns := range namespaces {
		if _, err := a.kube.CoreV1().Namespaces().Create(a.ctx(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
			Labels: map[string]string{"ns": ns}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Pods need the default service account; no controller-manager runs.
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns}}
		if _, err := a.kube.CoreV1().ServiceAccounts(ns).Create(a.ctx(), sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if _, err := a.crd.CoordinoV1alpha1().NodeConfigs().Create(a.ctx(), &coordinov1alpha1.NodeConfig{ObjectMeta: metav1.ObjectMeta{Name: n.Name},
		Spec: coordinov1alpha1.NodeConfigSpec{Blocks: []coordinov1alpha1.NodeBlock{{CIDR: block, Pool: "test"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := harness.NewAPIProxy(t, n.NS, harness.APIHostPort(srv.Config))
	n.Kubeconfig = n.Dir + "/kubeconfig"
	harness.WriteKubeconfig(t, srv.Config, p.Addr, n.Kubeconfig)
	return a
}

func (a *bedAPI) ctx() context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	a.t.Cleanup(cancel)
	return c
}

// pod creates the Pod object of a matrix pod, bound to the node, as the
// scheduler would before the runtime calls ADD.
func (a *bedAPI) pod(bp *bedPod, labels map[string]string) {
	no := false
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: bp.pod.Name, Namespace: bp.ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: a.node.Name, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/pause"}}},
	}
	if _, err := a.kube.CoreV1().Pods(bp.ns).Create(a.ctx(), p, metav1.CreateOptions{}); err != nil {
		a.t.Fatal(err)
	}
}

// apply makes the NetworkPolicies in the matrix namespaces exactly those of
// docs, waits until the compiler has published a PolicyIR of each at its
// current generation (and none of the others), and until the daemon holds
// that many valid policies.
func (a *bedAPI) apply(t *testing.T, docs string) error {
	a.t = t
	objs, err := controlplane.ParseFile("case", []byte(docs))
	if err != nil {
		return err
	}
	if len(objs.ClusterPolicies) > 0 {
		return fmt.Errorf("%d ClusterNetworkPolicies: this bed writes NetworkPolicies only", len(objs.ClusterPolicies))
	}
	want := map[string]*networkingv1.NetworkPolicy{}
	for _, np := range objs.Policies {
		want[np.Namespace+"/"+np.Name] = np
	}
	nps := func(ns string) typednetworkingv1.NetworkPolicyInterface {
		return a.kube.NetworkingV1().NetworkPolicies(ns)
	}
	for _, ns := range namespaces {
		list, err := nps(ns).List(a.ctx(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, have := range list.Items {
			if _, ok := want[ns+"/"+have.Name]; !ok {
				if err := nps(ns).Delete(a.ctx(), have.Name, metav1.DeleteOptions{}); err != nil {
					return err
				}
			}
		}
	}
	generation := map[string]int64{}
	for _, key := range slices.Sorted(maps.Keys(want)) {
		np := want[key]
		have, err := nps(np.Namespace).Get(a.ctx(), np.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			have, err = nps(np.Namespace).Create(a.ctx(), np, metav1.CreateOptions{})
		case err == nil:
			have.Spec = np.Spec
			have, err = nps(np.Namespace).Update(a.ctx(), have, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("networkpolicy %s: %w", key, err)
		}
		generation[key] = have.Generation
	}
	return a.waitApplied(generation)
}

func (a *bedAPI) waitApplied(generation map[string]int64) error {
	deadline := time.Now().Add(30 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		ok, why := a.compiled(generation)
		if ok {
			v, err := a.node.Metric("coordino_policies")
			ok, why = err == nil && v == float64(len(generation)), fmt.Sprintf("daemon holds %v policies (%v), want %d", v, err, len(generation))
		}
		if ok {
			return nil
		}
		last = why
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("policies not applied within 30s: %s", last)
}

// compiled reports whether the PolicyIRs in the matrix namespaces are
// exactly those of generation, each compiled from that generation and Valid.
func (a *bedAPI) compiled(generation map[string]int64) (bool, string) {
	seen := 0
	for _, ns := range namespaces {
		irs, err := a.crd.CoordinoV1alpha1().PolicyIRs(ns).List(a.ctx(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, ir := range irs.Items {
			key := ns + "/" + ir.Name
			gen, ok := generation[key]
			if !ok {
				return false, "stale PolicyIR " + key
			}
			valid := false
			for _, c := range ir.Status.Conditions {
				valid = valid || (c.Type == coordinov1alpha1.ConditionValid && c.Status == metav1.ConditionTrue)
			}
			if ir.Status.ObservedGeneration != gen || !valid {
				return false, fmt.Sprintf("PolicyIR %s at generation %d (want %d), conditions %+v", key, ir.Status.ObservedGeneration, gen, ir.Status.Conditions)
			}
			seen++
		}
	}
	return seen == len(generation), fmt.Sprintf("%d of %d PolicyIRs", seen, len(generation))
}
