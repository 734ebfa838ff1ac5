package controller

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// TestStaleNodeCacheNeverReclaims: a replica whose Node cache lacks a live
// node (its watch lagging, a missed event) must not reclaim that node's
// blocks; once the Node is really gone from the API server it does. Against
// the real API server. Before the live check, the first sync deleted the
// live node's NodeConfig and released its claim.
func TestStaleNodeCacheNeverReclaims(t *testing.T) {
	e := newEnv(t)
	suite := map[string]string{"coordino.test/suite": "stale"}
	e.pool("stale", coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.50.0.0/16"}, NodeSelector: suite})
	node := e.nodes("stale", 1, suite)[0]
	leader := e.start(testOptions(), "leader")
	var block string
	e.eventually("a block for the node", 20*time.Second, func() error {
		nc, err := e.nodeConfig(node)
		if err != nil || len(nc.Spec.Blocks) != 1 {
			return fmt.Errorf("NodeConfig: %v", err)
		}
		block = nc.Spec.Blocks[0].CIDR
		return nil
	})
	leader.stop()

	// A replica with current caches of pools, NodeConfigs and claims, and a
	// Node cache without the node.
	r := New(testOptions(), zaptest.NewLogger(t), e.core, e.crd, NewStores())
	pools, err := e.crd.CoordinoV1alpha1().IPPools().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pools.Items {
		_ = r.IPPools.Add(&pools.Items[i])
		r.OnIPPool(&pools.Items[i], false)
	}
	ncs, err := e.crd.CoordinoV1alpha1().NodeConfigs().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range ncs.Items {
		_ = r.NodeConfigs.Add(&ncs.Items[i])
	}
	claims, err := e.crd.CoordinoV1alpha1().IPBlocks().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range claims.Items {
		_ = r.IPBlocks.Add(&claims.Items[i])
		r.OnIPBlock(&claims.Items[i], false)
	}

	claim := coordinov1alpha1.BlockName(netip.MustParsePrefix(block))
	kept := func() error {
		nc, err := e.nodeConfig(node)
		if err != nil || len(nc.Spec.Blocks) != 1 || nc.Spec.Blocks[0].CIDR != block || nc.Spec.Blocks[0].Releasing {
			return fmt.Errorf("NodeConfig of the live node changed: %+v (%v)", nc, err)
		}
		c, err := e.crd.CoordinoV1alpha1().IPBlocks().Get(e.ctx, claim, metav1.GetOptions{})
		if err != nil || c.Spec.Phase != coordinov1alpha1.BlockActive {
			return fmt.Errorf("claim %s of the live node: %+v (%v)", claim, c, err)
		}
		return nil
	}
	if err := r.syncNode(e.ctx, node); err != nil {
		t.Fatal(err)
	}
	if err := kept(); err != nil {
		t.Fatal(err)
	}

	// Really deleted: the same replica reclaims.
	if err := e.core.CoreV1().Nodes().Delete(e.ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("blocks of the deleted node reclaimed", 20*time.Second, func() error {
		if err := r.syncNode(e.ctx, node); err != nil {
			return err
		}
		if _, err := e.nodeConfig(node); err == nil {
			return fmt.Errorf("NodeConfig still there")
		}
		if _, err := e.crd.CoordinoV1alpha1().IPBlocks().Get(e.ctx, claim, metav1.GetOptions{}); err == nil {
			return fmt.Errorf("claim still there")
		}
		return nil
	})
}
