package apiserver

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	yamlutil "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/controller"
	"github.com/coordino/coordino/test/testbed"
)

// TestStorageVersionMigration: objects a release that stored v1alpha1
// left in etcd (its CRDs: v1alpha1 only) are, once this tree's CRDs are
// applied and the controller's migration has run, stored as v1beta1 in
// etcd, with their content unchanged, and each CRD's storedVersions is
// [v1beta1]; a second run rewrites nothing. Read from etcd itself.
func TestStorageVersionMigration(t *testing.T) {
	s := StartWith(t, Options{NoCRDs: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dyn := dynamic.NewForConfigOrDie(s.Config)
	dir, err := CRDDir()
	if err != nil {
		t.Fatal(err)
	}
	current := map[string]*unstructured.Unstructured{}
	for _, plural := range graduated {
		b, err := os.ReadFile(filepath.Join(dir, "coordino.io_"+plural+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		crd := &unstructured.Unstructured{}
		if err := yamlutil.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096).Decode(&crd.Object); err != nil {
			t.Fatal(err)
		}
		current[plural] = crd
		// The previous release's CRD: v1alpha1 alone, stored.
		old := crd.DeepCopy()
		versions, _, _ := unstructured.NestedSlice(old.Object, "spec", "versions")
		var alpha []any
		for _, v := range versions {
			if m := v.(map[string]any); m["name"] == "v1alpha1" {
				m["storage"] = true
				alpha = append(alpha, m)
			}
		}
		_ = unstructured.SetNestedSlice(old.Object, alpha, "spec", "versions")
		if _, err := dyn.Resource(crdResource).Create(ctx, old, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitServed := func(version string) {
		t.Helper()
		for _, plural := range graduated {
			res := dyn.Resource(schema.GroupVersionResource{Group: coordinov1alpha1.GroupName, Version: version, Resource: plural})
			if err := testbed.WaitFor(ctx, plural+" "+version+" served", 30*time.Second, func() error {
				_, err := res.List(ctx, metav1.ListOptions{Limit: 1})
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitServed("v1alpha1")

	// Objects of the previous release, a cluster-scoped and a namespaced kind.
	crd := versioned.NewForConfigOrDie(s.Config).CoordinoV1alpha1()
	pool := &coordinov1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "stored-alpha"},
		Spec: coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.70.0.0/16"}}}
	if _, err := crd.IPPools().Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ir := &coordinov1alpha1.PolicyIR{ObjectMeta: metav1.ObjectMeta{Name: "stored-alpha", Namespace: "default"},
		Spec: coordinov1alpha1.PolicyIRSpec{PolicyTypes: []string{"Ingress"}}}
	if _, err := crd.PolicyIRs("default").Create(ctx, ir, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	keys := []string{"coordino.io/ippools/stored-alpha", "coordino.io/policyirs/default/stored-alpha"}
	storedAs := func(key string) string {
		t.Helper()
		b, err := s.Stored(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yamlutil.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096).Decode(&m); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		v, _ := m["apiVersion"].(string)
		return v
	}
	for _, k := range keys {
		if v := storedAs(k); v != "coordino.io/v1alpha1" {
			t.Fatalf("%s stored as %q before the upgrade, want coordino.io/v1alpha1", k, v)
		}
	}
	before, err := crd.IPPools().Get(ctx, "stored-alpha", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// The upgrade applies this tree's CRDs: v1beta1 stored from now on,
	// the old objects still as v1alpha1.
	for _, plural := range graduated {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			live, err := dyn.Resource(crdResource).Get(ctx, plural+".coordino.io", metav1.GetOptions{})
			if err != nil {
				return err
			}
			next := current[plural].DeepCopy()
			next.SetResourceVersion(live.GetResourceVersion())
			_, err = dyn.Resource(crdResource).Update(ctx, next, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	waitServed("v1beta1")
	for _, k := range keys {
		if v := storedAs(k); v != "coordino.io/v1alpha1" {
			t.Fatalf("%s stored as %q after the CRD update alone, want coordino.io/v1alpha1 still", k, v)
		}
	}

	n, err := controller.MigrateStorage(ctx, dyn, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if n != len(keys) {
		t.Errorf("migration rewrote %d objects, want %d", n, len(keys))
	}
	for _, k := range keys {
		if v := storedAs(k); v != "coordino.io/v1beta1" {
			t.Errorf("%s stored as %q after the migration, want coordino.io/v1beta1", k, v)
		}
	}
	for _, plural := range graduated {
		c, err := dyn.Resource(crdResource).Get(ctx, plural+".coordino.io", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if stored, _, _ := unstructured.NestedStringSlice(c.Object, "status", "storedVersions"); !reflect.DeepEqual(stored, []string{"v1beta1"}) {
			t.Errorf("%s: storedVersions %v after the migration, want [v1beta1]", plural, stored)
		}
	}
	after, err := crd.IPPools().Get(ctx, "stored-alpha", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before.Spec, after.Spec) {
		t.Errorf("migration changed the pool: %+v, was %+v", after.Spec, before.Spec)
	}
	if n, err := controller.MigrateStorage(ctx, dyn, zap.NewNop()); err != nil || n != 0 {
		t.Errorf("second migration: %d objects rewritten, %v; want 0, nil", n, err)
	}
}
