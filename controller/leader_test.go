package controller

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// TestLeaderKilledMidAllocation: two replicas with separate clients; the
// leader dies (context cut, Lease not released: a crash) while it is
// handing out blocks to 50 new nodes. The standby takes over; in the end
// every node has exactly one block, no block is held twice and no claim is
// lost.
func TestLeaderKilledMidAllocation(t *testing.T) {
	e := newEnv(t)
	e.pool("pool", coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.60.0.0/16"}})
	o := testOptions()
	o.ReleaseLease = false
	o.Workers = 2
	a := e.start(o, "replica-a")
	e.eventually("replica-a leads", 30*time.Second, func() error { return e.leader("replica-a") })
	b := e.start(o, "replica-b")
	defer b.stop()
	nodes := e.nodes("n", 50, nil)
	e.eventually("replica-a in the middle of allocating", 30*time.Second, func() error {
		l, err := e.crd.CoordinoV1alpha1().IPBlocks().List(e.ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) < 5 {
			return fmt.Errorf("%d claims (%v)", len(l.Items), err)
		}
		return nil
	})
	a.stop()
	e.eventually("replica-b leads", 30*time.Second, func() error { return e.leader("replica-b") })
	e.eventually("every node has one block, none twice, none lost", 60*time.Second, func() error {
		per, err := e.checkBlocks()
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if len(per[n]) != 1 {
				return fmt.Errorf("node %s has %v", n, per[n])
			}
		}
		l, err := e.crd.CoordinoV1alpha1().IPBlocks().List(e.ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 50 {
			return fmt.Errorf("%d claims for 50 nodes (%v)", len(l.Items), err)
		}
		return nil
	})
}

// TestOverlappingControllersNeverShareABlock runs two replicas that both
// believe they lead (no leader election), the worst overlap across a
// leader change, against the same nodes: the IPBlock claims keep every
// block with one node.
func TestOverlappingControllersNeverShareABlock(t *testing.T) {
	e := newEnv(t)
	e.pool("pool", coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.70.0.0/19"}})
	o := testOptions()
	o.LeaderElect = false
	nodes := e.nodes("n", 30, nil)
	a := e.start(o, "replica-a")
	b := e.start(o, "replica-b")
	defer a.stop()
	defer b.stop()
	e.eventually("every node has one block, none twice", 60*time.Second, func() error {
		per, err := e.checkBlocks()
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if len(per[n]) < 1 {
				return fmt.Errorf("node %s has %v", n, per[n])
			}
		}
		return nil
	})
}

func (e *env) leader(id string) error {
	l, err := e.core.CoordinationV1().Leases("coordino-system").Get(e.ctx, LeaseName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != id {
		return fmt.Errorf("holder %v", l.Spec.HolderIdentity)
	}
	return nil
}
