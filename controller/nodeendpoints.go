package controller

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// deleteNodeEndpoints removes the NodeEndpoints of a deleted node: its
// daemon is gone with it, and other nodes must stop resolving its pods'
// addresses to their identities at once (the addresses may be reused).
// The object is also owned by its Node, so the API's garbage collector
// removes it where one runs; this covers clusters and tests without one.
func (c *Controller) deleteNodeEndpoints(ctx context.Context, node string) error {
	err := c.crd.CoordinoV1alpha1().NodeEndpoints().Delete(ctx, node, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	c.writes.add("nodeendpoints", "delete")
	if err != nil {
		return fmt.Errorf("delete NodeEndpoints %s: %w", node, err)
	}
	return nil
}
