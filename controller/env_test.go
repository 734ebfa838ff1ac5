package controller

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/test/apiserver"
)

// env is one real API server with admin clients.
type env struct {
	t    *testing.T
	s    *apiserver.Server
	core kubernetes.Interface
	crd  versioned.Interface
	ctx  context.Context
}

func newEnv(t *testing.T) *env {
	s := apiserver.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, s: s, core: kubernetes.NewForConfigOrDie(s.Config), crd: versioned.NewForConfigOrDie(s.Config), ctx: ctx}
	e.namespace("coordino-system", nil)
	return e
}

func testOptions() Options {
	o := DefaultOptions()
	o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 3*time.Second, 2*time.Second, 250*time.Millisecond
	o.MetricsAddr = ""
	o.IdentityGCGrace, o.IdentityGCPeriod = time.Second, 200*time.Millisecond
	o.ReleaseEmptyAfter = 0
	o.ResyncPeriod = 0
	o.KubeAPIQPS, o.KubeAPIBurst = 0, 0 // the test server's client limits
	return o
}

// instance is one in-process controller replica with its own client.
type instance struct {
	cancel context.CancelFunc
	done   chan error
}

// start runs a controller replica; stop cancels it (in-flight requests are
// cut, as by a crash when ReleaseLease is off) and waits for it.
func (e *env) start(opts Options, id string) *instance {
	cfg := rest.CopyConfig(e.s.Config)
	ctx, cancel := context.WithCancel(e.ctx)
	opts.ID = id
	in := &instance{cancel: cancel, done: make(chan error, 1)}
	log := zaptest.NewLogger(e.t).Named(id)
	go func() { in.done <- Run(ctx, cfg, opts, log) }()
	e.t.Cleanup(func() { in.stop() })
	return in
}

func (in *instance) stop() {
	in.cancel()
	<-in.done
	in.done <- nil // for a second stop
}

func (e *env) namespace(name string, labels map[string]string) {
	e.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := e.core.CoreV1().Namespaces().Create(e.ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
	if _, err := e.core.CoreV1().ServiceAccounts(name).Create(e.ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatal(err)
	}
}

func (e *env) pool(name string, spec coordinov1alpha1.IPPoolSpec) {
	e.t.Helper()
	if _, err := e.crd.CoordinoV1alpha1().IPPools().Create(e.ctx, &coordinov1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) nodes(prefix string, n int, labels map[string]string) []string {
	e.t.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%02d", prefix, i)
	}
	e.inParallel(n, func(i int) error {
		_, err := e.core.CoreV1().Nodes().Create(e.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: labels}}, metav1.CreateOptions{})
		return err
	})
	return names
}

// inParallel runs write(0..n-1) concurrently (many objects in a test's
// set-up) and fails the test on the first error.
func (e *env) inParallel(n int, write func(i int) error) {
	e.t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- write(i)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *env) pod(ns, name, node string, labels map[string]string) {
	e.t.Helper()
	no := false
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, AutomountServiceAccountToken: &no, Containers: []corev1.Container{{Name: "c", Image: "coordino.test/pause:1"}}}}
	if _, err := e.core.CoreV1().Pods(ns).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) deletePod(ns, name string) {
	e.t.Helper()
	zero := int64(0)
	if err := e.core.CoreV1().Pods(ns).Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		e.t.Fatal(err)
	}
}

// eventually polls cond until it returns nil.
func (e *env) eventually(what string, timeout time.Duration, cond func() error) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// never checks that cond stays false (returns an error) for d.
func (e *env) never(what string, d time.Duration, cond func() error) {
	e.t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if cond() == nil {
			e.t.Fatalf("%s happened", what)
		}
	}
}

func (e *env) nodeConfig(name string) (*coordinov1alpha1.NodeConfig, error) {
	return e.crd.CoordinoV1alpha1().NodeConfigs().Get(e.ctx, name, metav1.GetOptions{})
}

// report writes the daemon's usage report (status at the current
// generation, or at a given older one when gen >= 0).
func (e *env) report(node string, used map[string]int32, gen int64) {
	e.t.Helper()
	for {
		nc, err := e.nodeConfig(node)
		if err != nil {
			e.t.Fatal(err)
		}
		nc.Status.Blocks = nil
		for _, b := range nc.Spec.Blocks {
			p := netip.MustParsePrefix(b.CIDR)
			nc.Status.Blocks = append(nc.Status.Blocks, coordinov1alpha1.BlockUsage{CIDR: b.CIDR, Used: used[b.CIDR], Capacity: int32(blockCapacity(p))})
		}
		nc.Status.ObservedGeneration = nc.Generation
		if gen >= 0 {
			nc.Status.ObservedGeneration = gen
		}
		_, err = e.crd.CoordinoV1alpha1().NodeConfigs().UpdateStatus(e.ctx, nc, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			e.t.Fatal(err)
		}
		return
	}
}

// checkBlocks verifies the cluster-wide block invariants: no block in two
// NodeConfigs, every listed block claimed by its node, no Active claim
// outside its node's spec, no overlapping blocks. It returns the blocks
// per node.
func (e *env) checkBlocks() (map[string][]netip.Prefix, error) {
	ncs, err := e.crd.CoordinoV1alpha1().NodeConfigs().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	claims, err := e.crd.CoordinoV1alpha1().IPBlocks().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	claimOf := map[string]coordinov1alpha1.IPBlockSpec{}
	for _, c := range claims.Items {
		claimOf[c.Spec.CIDR] = c.Spec
	}
	holder := map[netip.Prefix]string{}
	per := map[string][]netip.Prefix{}
	inSpec := map[string]string{}
	for _, nc := range ncs.Items {
		for _, b := range nc.Spec.Blocks {
			p := netip.MustParsePrefix(b.CIDR)
			if h, dup := holder[p]; dup {
				return nil, fmt.Errorf("block %s held by %s and %s", p, h, nc.Name)
			}
			for q, h := range holder {
				if q.Overlaps(p) {
					return nil, fmt.Errorf("block %s of %s overlaps %s of %s", p, nc.Name, q, h)
				}
			}
			holder[p] = nc.Name
			inSpec[b.CIDR] = nc.Name
			if b.Pool == coordinov1alpha1.PodCIDRsPool {
				per[nc.Name] = append(per[nc.Name], p)
				continue
			}
			if c, ok := claimOf[b.CIDR]; !ok || c.Node != nc.Name {
				return nil, fmt.Errorf("block %s in NodeConfig %s has claim %+v", p, nc.Name, c)
			}
			per[nc.Name] = append(per[nc.Name], p)
		}
	}
	for cidr, c := range claimOf {
		if c.Phase == coordinov1alpha1.BlockActive && inSpec[cidr] != c.Node {
			return nil, fmt.Errorf("claim %s of %s is not in its NodeConfig (lost)", cidr, c.Node)
		}
	}
	return per, nil
}
