package apiserver

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/controller"
	"github.com/coordino/coordino/test/testbed"
)

// graduated are the kinds served as v1beta1 beside v1alpha1 (hack/generate-api.sh).
var graduated = controller.GraduatedResources

// TestV1beta1ServedBesideV1alpha1: the graduated CRDs serve v1beta1 with
// v1alpha1's schema and store v1beta1 (v1alpha1 stays served, so a
// release that knows only v1alpha1 reads all that is stored through it),
// and an object written through either version reads the same through
// the other, with the schema's validation and defaults applied to both.
func TestV1beta1ServedBesideV1alpha1(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(s.Config)
	for _, plural := range graduated {
		crd, err := dyn.Resource(crdResource).Get(ctx, plural+".coordino.io", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
		byName := map[string]map[string]any{}
		for _, v := range versions {
			m := v.(map[string]any)
			byName[m["name"].(string)] = m
		}
		alpha, beta := byName["v1alpha1"], byName["v1beta1"]
		if len(versions) != 2 || alpha == nil || beta == nil {
			t.Fatalf("%s: versions %v, want v1alpha1 and v1beta1", plural, versions)
		}
		if alpha["storage"] != false || beta["storage"] != true || alpha["served"] != true || beta["served"] != true {
			t.Errorf("%s: v1alpha1 served %v storage %v, v1beta1 served %v storage %v; want both served, v1beta1 stored",
				plural, alpha["served"], alpha["storage"], beta["served"], beta["storage"])
		}
		for _, field := range []string{"schema", "subresources", "additionalPrinterColumns"} {
			if !reflect.DeepEqual(alpha[field], beta[field]) {
				t.Errorf("%s: %s differs between v1alpha1 and v1beta1", plural, field)
			}
		}
		if stored, _, _ := unstructured.NestedStringSlice(crd.Object, "status", "storedVersions"); !reflect.DeepEqual(stored, []string{"v1beta1"}) {
			t.Errorf("%s: storedVersions %v, want [v1beta1]", plural, stored)
		}
	}

	alpha := versioned.NewForConfigOrDie(s.Config).CoordinoV1alpha1()
	beta := dyn.Resource(schema.GroupVersionResource{Group: "coordino.io", Version: "v1beta1", Resource: "ippools"})
	// v1alpha1 → v1beta1.
	if _, err := alpha.IPPools().Create(ctx, &coordinov1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "from-alpha"},
		Spec: coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.244.0.0/16"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *unstructured.Unstructured
	if err := testbed.WaitFor(ctx, "v1beta1 served", 30*time.Second, func() error {
		var err error
		got, err = beta.Get(ctx, "from-alpha", metav1.GetOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cidrs, _, _ := unstructured.NestedStringSlice(got.Object, "spec", "cidrs")
	block, _, _ := unstructured.NestedInt64(got.Object, "spec", "blockSizeIPv4")
	if got.GetAPIVersion() != "coordino.io/v1beta1" || !reflect.DeepEqual(cidrs, []string{"10.244.0.0/16"}) || block != 26 {
		t.Errorf("v1alpha1 object read as v1beta1: %s, cidrs %v, blockSizeIPv4 %d", got.GetAPIVersion(), cidrs, block)
	}
	// v1beta1 → v1alpha1, defaults applied.
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "coordino.io/v1beta1", "kind": "IPPool",
		"metadata": map[string]any{"name": "from-beta"},
		"spec":     map[string]any{"cidrs": []any{"fd00:10:244::/56"}},
	}}
	if _, err := beta.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	back, err := alpha.IPPools().Get(ctx, "from-beta", metav1.GetOptions{})
	if err != nil || !reflect.DeepEqual(back.Spec.CIDRs, []string{"fd00:10:244::/56"}) || back.Spec.BlockSizeIPv6 != 122 {
		t.Fatalf("v1beta1 object read as v1alpha1: %+v, %v", back, err)
	}
	// The same validation on both.
	bad := obj.DeepCopy()
	bad.SetName("bad-beta")
	_ = unstructured.SetNestedStringSlice(bad.Object, []string{"10.244.0.1/16"}, "spec", "cidrs")
	if _, err := beta.Create(ctx, bad, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "host bits zero") {
		t.Errorf("invalid v1beta1 pool: error %v, want the schema's host-bits rule", err)
	}
}
