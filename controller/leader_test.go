package controller

import (
	"fmt"
	"net/netip"
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

// TestStartsFromEveryClaim: a new leader finds blocks claimed for 300
// nodes but never assigned (the previous leader died between the two
// writes); each node must end with its own block and no other. The block
// index is fed by the IPBlock informer's handler, which can lag behind the
// informer's store, so allocation waits for the handlers (lead). On an
// idle machine this test passed without that wait too; one CI run under
// load saw a node get a second block after a leader change
// (TestLeaderKilledMidAllocation), which that lag explains.
func TestStartsFromEveryClaim(t *testing.T) {
	e := newEnv(t)
	e.pool("pool", coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.61.0.0/16"}})
	nodes := e.nodes("n", 300, nil)
	want := make([]netip.Prefix, len(nodes))
	for i := range want {
		want[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 61, byte(i / 4), byte(i % 4 * 64)}), 26)
	}
	e.inParallel(len(nodes), func(i int) error {
		_, err := e.crd.CoordinoV1alpha1().IPBlocks().Create(e.ctx, &coordinov1alpha1.IPBlock{
			ObjectMeta: metav1.ObjectMeta{Name: coordinov1alpha1.BlockName(want[i])},
			Spec:       coordinov1alpha1.IPBlockSpec{CIDR: want[i].String(), Pool: "pool", Node: nodes[i], Phase: coordinov1alpha1.BlockActive},
		}, metav1.CreateOptions{})
		return err
	})
	e.start(testOptions(), "replica-a")
	e.eventually("every node has its claimed block and no other", 60*time.Second, func() error {
		per, err := e.checkBlocks()
		if err != nil {
			return err
		}
		for i, n := range nodes {
			if len(per[n]) != 1 || per[n][0] != want[i] {
				return fmt.Errorf("node %s has %v, claimed %s", n, per[n], want[i])
			}
		}
		l, err := e.crd.CoordinoV1alpha1().IPBlocks().List(e.ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != len(nodes) {
			return fmt.Errorf("%d claims for %d nodes (%v)", len(l.Items), len(nodes), err)
		}
		return nil
	})
}
