package kubernetes

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/controller"
	"github.com/coordino/coordino/test/apiserver"
)

// TestRBACOnAPIServer applies the base's RBAC and admission policy to a
// real API server and checks what each component's token may do: the
// daemon writes the status of its own node's NodeConfig and nothing else,
// the controller owns the allocation objects but never NodeConfig status.
func TestRBACOnAPIServer(t *testing.T) {
	s := apiserver.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	crdAdmin := versioned.NewForConfigOrDie(s.Config)
	for _, o := range render(t, "overlays/primary") {
		var err error
		switch v := o.(type) {
		case *corev1.Namespace:
			_, err = admin.CoreV1().Namespaces().Create(ctx, v, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			_, err = admin.CoreV1().ServiceAccounts(v.Namespace).Create(ctx, v, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = admin.RbacV1().ClusterRoles().Create(ctx, v, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, v, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = admin.RbacV1().Roles(v.Namespace).Create(ctx, v, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = admin.RbacV1().RoleBindings(v.Namespace).Create(ctx, v, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			_, err = admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, v, metav1.CreateOptions{})
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			_, err = admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, v, metav1.CreateOptions{})
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("apply %T: %v", o, err)
		}
	}
	// The example pools pass the CRD schema.
	for f, p := range examplePools(t) {
		if _, err := crdAdmin.CoordinoV1alpha1().IPPools().Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Errorf("%s rejected: %v", f, err)
		}
	}
	for _, n := range []string{"node-a", "node-b"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		nc := &coordinov1alpha1.NodeConfig{ObjectMeta: metav1.ObjectMeta{Name: n},
			Spec: coordinov1alpha1.NodeConfigSpec{Blocks: []coordinov1alpha1.NodeBlock{{CIDR: "10.1.0.0/26", Pool: "p"}}}}
		if n == "node-b" {
			nc.Spec.Blocks[0].CIDR = "10.1.0.64/26"
		}
		if _, err := crdAdmin.CoordinoV1alpha1().NodeConfigs().Create(ctx, nc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	no := false
	pod, err := admin.CoreV1().Pods("coordino-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "daemon-a", Namespace: "coordino-system"},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "coordino-daemon", AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "d", Image: "coordino"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	daemonCfg, err := s.PodServiceAccountConfig(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	unboundCfg, err := s.ServiceAccountConfig(ctx, "coordino-system", "coordino-daemon")
	if err != nil {
		t.Fatal(err)
	}
	controllerCfg, err := s.ServiceAccountConfig(ctx, "coordino-system", "coordino-controller")
	if err != nil {
		t.Fatal(err)
	}
	writeStatus := func(cfg *rest.Config, node string) error {
		cl := versioned.NewForConfigOrDie(cfg).CoordinoV1alpha1().NodeConfigs()
		nc, err := crdAdmin.CoordinoV1alpha1().NodeConfigs().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		nc.Status.Addresses = []string{"192.0.2.7"}
		nc.Status.ObservedGeneration = nc.Generation
		_, err = cl.UpdateStatus(ctx, nc, metav1.UpdateOptions{})
		return err
	}
	// The policy takes effect asynchronously: wait until the other node's
	// status is refused, then check everything else.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := writeStatus(daemonCfg, "node-b")
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon of node-a may write node-b's NodeConfig status: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := writeStatus(daemonCfg, "node-a"); err != nil {
		t.Errorf("daemon of node-a cannot report its own status: %v", err)
	}
	if err := writeStatus(unboundCfg, "node-a"); err == nil {
		t.Error("a daemon token bound to no pod wrote NodeConfig status")
	}
	daemonCRD := versioned.NewForConfigOrDie(daemonCfg).CoordinoV1alpha1()
	endpointsOf := func(node string) *coordinov1alpha1.NodeEndpoints {
		return &coordinov1alpha1.NodeEndpoints{ObjectMeta: metav1.ObjectMeta{Name: node},
			Spec: coordinov1alpha1.NodeEndpointsSpec{EndpointCount: 1, Endpoints: []coordinov1alpha1.NodeEndpoint{
				{Addresses: []string{"10.1.0.5"}, Identity: 300, NamedPorts: []coordinov1alpha1.NamedPort{{Name: "http", Protocol: "TCP", Port: 8080}}}}}}
	}
	if _, err := daemonCRD.NodeEndpoints().Create(ctx, endpointsOf("node-b"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("daemon of node-a created node-b's NodeEndpoints: %v", err)
	}
	if ne, err := daemonCRD.NodeEndpoints().Create(ctx, endpointsOf("node-a"), metav1.CreateOptions{}); err != nil {
		t.Errorf("daemon of node-a cannot publish its NodeEndpoints: %v", err)
	} else {
		ne.Spec.Endpoints[0].Addresses = append(ne.Spec.Endpoints[0].Addresses, "fd00::5")
		if _, err := daemonCRD.NodeEndpoints().Update(ctx, ne, metav1.UpdateOptions{}); err != nil {
			t.Errorf("daemon of node-a cannot update its NodeEndpoints: %v", err)
		}
		if err := daemonCRD.NodeEndpoints().Delete(ctx, "node-a", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("daemon deleted NodeEndpoints (the controller's job): %v", err)
		}
		if err := versioned.NewForConfigOrDie(controllerCfg).CoordinoV1alpha1().NodeEndpoints().Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
			t.Errorf("controller cannot delete a node's NodeEndpoints: %v", err)
		}
	}
	if _, err := versioned.NewForConfigOrDie(unboundCfg).CoordinoV1alpha1().NodeEndpoints().Create(ctx, endpointsOf("node-a"), metav1.CreateOptions{}); err == nil {
		t.Error("a daemon token bound to no pod wrote NodeEndpoints")
	}
	bad := endpointsOf("node-a")
	bad.Spec.Endpoints[0].Identity = 0x800001 // temporary identities are never published
	if _, err := crdAdmin.CoordinoV1alpha1().NodeEndpoints().Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("a node-local identity passed the NodeEndpoints schema: %v", err)
	}
	nc, _ := crdAdmin.CoordinoV1alpha1().NodeConfigs().Get(ctx, "node-a", metav1.GetOptions{})
	nc.Spec.Blocks = append(nc.Spec.Blocks, coordinov1alpha1.NodeBlock{CIDR: "10.1.1.0/26", Pool: "p"})
	if _, err := daemonCRD.NodeConfigs().Update(ctx, nc, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("daemon wrote its NodeConfig spec: %v", err)
	}
	if _, err := daemonCRD.IPBlocks().Create(ctx, &coordinov1alpha1.IPBlock{ObjectMeta: metav1.ObjectMeta{Name: "10.9.0.0-26"},
		Spec: coordinov1alpha1.IPBlockSpec{CIDR: "10.9.0.0/26", Pool: "p", Node: "node-a", Phase: "Active"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("daemon claimed a block: %v", err)
	}
	if _, err := daemonCRD.Identities().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("daemon cannot list identities: %v", err)
	}
	if _, err := daemonCRD.PolicyIRs("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("daemon cannot list policyirs: %v", err)
	}
	if _, err := kubernetes.NewForConfigOrDie(daemonCfg).NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("daemon lists networkpolicies (the controller compiles them): %v", err)
	}
	if _, err := daemonCRD.PolicyIRs("default").Create(ctx, &coordinov1alpha1.PolicyIR{ObjectMeta: metav1.ObjectMeta{Name: "x"},
		Spec: coordinov1alpha1.PolicyIRSpec{PolicyTypes: []string{}}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("daemon wrote a PolicyIR: %v", err)
	}
	// With --routing=bgp: Services and their EndpointSlices (addresses
	// announced by serviceSelector, Local ones where an endpoint is ready).
	if _, err := kubernetes.NewForConfigOrDie(daemonCfg).DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("daemon cannot list endpointslices: %v", err)
	}
	if _, err := kubernetes.NewForConfigOrDie(daemonCfg).CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("daemon cannot list services: %v", err)
	}
	if _, err := kubernetes.NewForConfigOrDie(daemonCfg).CoreV1().Secrets("coordino-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("daemon lists secrets: %v", err)
	}

	ctlCRD := versioned.NewForConfigOrDie(controllerCfg).CoordinoV1alpha1()
	if err := writeStatus(controllerCfg, "node-a"); !apierrors.IsForbidden(err) {
		t.Errorf("controller wrote NodeConfig status: %v", err)
	}
	if _, err := ctlCRD.IPBlocks().Create(ctx, &coordinov1alpha1.IPBlock{ObjectMeta: metav1.ObjectMeta{Name: "10.9.0.0-26"},
		Spec: coordinov1alpha1.IPBlockSpec{CIDR: "10.9.0.0/26", Pool: "p", Node: "node-a", Phase: "Active"}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("controller cannot claim a block: %v", err)
	}
	if _, err := kubernetes.NewForConfigOrDie(controllerCfg).NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("controller cannot list networkpolicies: %v", err)
	}
	if _, err := ctlCRD.PolicyIRs("default").Create(ctx, &coordinov1alpha1.PolicyIR{ObjectMeta: metav1.ObjectMeta{Name: "x"},
		Spec: coordinov1alpha1.PolicyIRSpec{PolicyTypes: []string{}}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("controller cannot create a PolicyIR: %v", err)
	}
	ctlCore := kubernetes.NewForConfigOrDie(controllerCfg).CoreV1()
	if _, err := ctlCore.ConfigMaps("coordino-system").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "coordino-identity-allocator"}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("controller cannot create its allocator ConfigMap: %v", err)
	}
	if _, err := ctlCore.ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("controller reads other ConfigMaps: %v", err)
	}
	if _, err := ctlCore.Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("controller creates pods: %v", err)
	}

	// The storage version migration as a release that stored v1alpha1
	// leaves it (storedVersions naming both), by the controller's account.
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	dynAdmin := dynamic.NewForConfigOrDie(s.Config)
	for _, plural := range controller.GraduatedResources {
		crd, err := dynAdmin.Resource(crds).Get(ctx, plural+".coordino.io", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_ = unstructured.SetNestedStringSlice(crd.Object, []string{"v1alpha1", "v1beta1"}, "status", "storedVersions")
		if _, err := dynAdmin.Resource(crds).UpdateStatus(ctx, crd, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ctlDyn := dynamic.NewForConfigOrDie(controllerCfg)
	if n, err := controller.MigrateStorage(ctx, ctlDyn, zap.NewNop()); err != nil || n == 0 {
		t.Errorf("controller's storage version migration: %d objects rewritten, %v", n, err)
	}
	if _, err := ctlDyn.Resource(crds).Get(ctx, "ipblocks.coordino.io", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("controller reads a CRD it does not migrate: %v", err)
	}
}
