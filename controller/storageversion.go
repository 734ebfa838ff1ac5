package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// GraduatedResources are the kinds served as v1beta1 beside v1alpha1 and
// stored as v1beta1 (hack/generate-api.sh).
var GraduatedResources = []string{"ippools", "nodeconfigs", "identities", "policyirs", "nodeisolationpolicies"}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// MigrateStorage brings the stored objects of each graduated kind to its
// CRD's storage version. The API server encodes every write in the
// storage version, so an unchanged update of each object rewrites those a
// release with another storage version left; the CRD's
// status.storedVersions is then set to the storage version alone, which
// records that no object of another version is left in etcd and lets a
// later release stop serving v1alpha1. A kind whose storedVersions already
// says so is skipped, so after the first run it costs one read per kind.
// It returns the number of objects rewritten.
func MigrateStorage(ctx context.Context, dyn dynamic.Interface, log *zap.Logger) (int, error) {
	total := 0
	for _, plural := range GraduatedResources {
		n, err := migrateResource(ctx, dyn, plural, log)
		total += n
		if err != nil {
			return total, fmt.Errorf("storage version migration of %s.%s: %w", plural, coordinov1alpha1.GroupName, err)
		}
	}
	return total, nil
}

func migrateResource(ctx context.Context, dyn dynamic.Interface, plural string, log *zap.Logger) (int, error) {
	name := plural + "." + coordinov1alpha1.GroupName
	crd, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	storage, err := storageVersion(crd)
	if err != nil {
		return 0, err
	}
	stored, _, _ := unstructured.NestedStringSlice(crd.Object, "status", "storedVersions")
	if slices.Equal(stored, []string{storage}) {
		return 0, nil
	}
	res := dyn.Resource(schema.GroupVersionResource{Group: coordinov1alpha1.GroupName, Version: storage, Resource: plural})
	n := 0
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := res.List(ctx, opts)
		if err != nil {
			return n, err
		}
		for i := range list.Items {
			if err := rewrite(ctx, res, &list.Items[i]); err != nil {
				return n, fmt.Errorf("rewrite %s: %w", objectName(&list.Items[i]), err)
			}
			n++
		}
		if opts.Continue = list.GetContinue(); opts.Continue == "" {
			break
		}
	}
	// Only after every object: a failure above leaves storedVersions
	// naming the old version, and the next run starts over.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		crd, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := unstructured.SetNestedStringSlice(crd.Object, []string{storage}, "status", "storedVersions"); err != nil {
			return err
		}
		_, err = dyn.Resource(crdResource).UpdateStatus(ctx, crd, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return n, fmt.Errorf("set storedVersions of %s to [%s]: %w", name, storage, err)
	}
	log.Info("stored objects rewritten in the storage version", zap.String("crd", name),
		zap.Strings("storedVersions", stored), zap.String("storageVersion", storage), zap.Int("objects", n))
	return n, nil
}

// rewrite writes obj back unchanged; on a conflict it reads the object
// again (someone else's write stored it in the storage version already,
// but another write may follow, so it is rewritten anyway).
func rewrite(ctx context.Context, res dynamic.NamespaceableResourceInterface, obj *unstructured.Unstructured) error {
	ri := dynamic.ResourceInterface(res)
	if ns := obj.GetNamespace(); ns != "" {
		ri = res.Namespace(ns)
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		_, err := ri.Update(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			fresh, gerr := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			obj = fresh
		}
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil // deleted meanwhile: nothing left stored
	}
	return err
}

func objectName(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}

// storageVersion is the name of the CRD's version marked storage.
func storageVersion(crd *unstructured.Unstructured) (string, error) {
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		if m, ok := v.(map[string]any); ok && m["storage"] == true {
			if name, ok := m["name"].(string); ok {
				return name, nil
			}
		}
	}
	return "", fmt.Errorf("CRD %s has no storage version in spec.versions", crd.GetName())
}

// migrateStorageUntilDone runs MigrateStorage until it succeeds, retrying
// after a failure (an API server restarting, RBAC not yet applied) while
// the controller leads.
func migrateStorageUntilDone(ctx context.Context, dyn dynamic.Interface, log *zap.Logger, every time.Duration) {
	for {
		_, err := MigrateStorage(ctx, dyn, log)
		if err == nil || ctx.Err() != nil {
			return
		}
		log.Warn("storage version migration failed; retrying", zap.Error(err), zap.Duration("after", every))
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
