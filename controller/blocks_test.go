package controller

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// TestBlocks runs the block life cycle against one real API server; each
// subtest has its own nodes and pool (selected by a node label) and its
// own controller.
func TestBlocks(t *testing.T) {
	e := newEnv(t)
	sel := func(s string) map[string]string { return map[string]string{"coordino.test/suite": s} }

	t.Run("50NodesGetBlocks", func(t *testing.T) {
		e.t = t
		e.pool("fifty", coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.10.0.0/16", "fd00:10::/112"}, NodeSelector: sel("fifty")})
		nodes := e.nodes("fifty", 50, sel("fifty"))
		c := e.start(testOptions(), "fifty")
		defer c.stop()
		e.eventually("every node has one IPv4 and one IPv6 block", 60*time.Second, func() error {
			per, err := e.checkBlocks()
			if err != nil {
				return err
			}
			for _, n := range nodes {
				var v4, v6 int
				for _, p := range per[n] {
					if p.Addr().Is4() && p.Bits() == 26 && netip.MustParsePrefix("10.10.0.0/16").Contains(p.Addr()) {
						v4++
					}
					if p.Addr().Is6() && p.Bits() == 122 {
						v6++
					}
				}
				if v4 != 1 || v6 != 1 {
					return fmt.Errorf("node %s has blocks %v", n, per[n])
				}
			}
			return nil
		})
		e.eventually("pool status counts 100 blocks", 20*time.Second, func() error {
			p, err := e.crd.CoordinoV1alpha1().IPPools().Get(e.ctx, "fifty", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.AllocatedBlocks != 100 || p.Status.TotalBlocks != 1024+1024 {
				return fmt.Errorf("status %+v", p.Status)
			}
			// Per family, with its block size (kubectl get's Block4/Block6).
			want := []coordinov1alpha1.PoolFamilyStatus{{Family: "IPv4", BlockSize: 26, TotalBlocks: 1024, AllocatedBlocks: 50},
				{Family: "IPv6", BlockSize: 122, TotalBlocks: 1024, AllocatedBlocks: 50}}
			if !slices.Equal(p.Status.Families, want) {
				return fmt.Errorf("families %+v, want %+v", p.Status.Families, want)
			}
			return nil
		})
	})

	t.Run("TopUpAndRelease", func(t *testing.T) {
		e.t = t
		e.pool("topup", coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.20.0.0/16"}, NodeSelector: sel("topup")})
		node := e.nodes("topup", 1, sel("topup"))[0]
		c := e.start(testOptions(), "topup")
		defer c.stop()
		var first string
		e.eventually("a first block", 20*time.Second, func() error {
			nc, err := e.nodeConfig(node)
			if err != nil || len(nc.Spec.Blocks) != 1 {
				return fmt.Errorf("%v %v", nc, err)
			}
			first = nc.Spec.Blocks[0].CIDR
			return nil
		})
		// 50 of 64 used leaves 14 < 16 free: top up before the node runs out.
		e.report(node, map[string]int32{first: 50}, -1)
		var second string
		e.eventually("a second block", 20*time.Second, func() error {
			nc, err := e.nodeConfig(node)
			if err != nil || len(nc.Spec.Blocks) != 2 {
				return fmt.Errorf("blocks %v %v", nc.Spec.Blocks, err)
			}
			for _, b := range nc.Spec.Blocks {
				if b.CIDR != first {
					second = b.CIDR
				}
			}
			return nil
		})
		// Pods go away: the second block is surplus and gets released.
		e.report(node, map[string]int32{first: 5}, -1)
		e.eventually("second block marked releasing", 20*time.Second, func() error {
			nc, _ := e.nodeConfig(node)
			for _, b := range nc.Spec.Blocks {
				if b.CIDR == second && b.Releasing {
					return nil
				}
			}
			return fmt.Errorf("blocks %+v", nc.Spec.Blocks)
		})
		// A report from before the daemon saw the flag must not complete it.
		nc, _ := e.nodeConfig(node)
		e.report(node, map[string]int32{first: 5}, nc.Generation-1)
		e.never("block removed on a stale report", 2*time.Second, func() error {
			nc, _ := e.nodeConfig(node)
			if len(nc.Spec.Blocks) == 1 {
				return nil
			}
			return fmt.Errorf("still there")
		})
		e.report(node, map[string]int32{first: 5}, -1)
		e.eventually("second block removed and its claim deleted", 20*time.Second, func() error {
			nc, _ := e.nodeConfig(node)
			if len(nc.Spec.Blocks) != 1 || nc.Spec.Blocks[0].CIDR != first {
				return fmt.Errorf("blocks %+v", nc.Spec.Blocks)
			}
			if _, err := e.crd.CoordinoV1alpha1().IPBlocks().Get(e.ctx, coordinov1alpha1.BlockName(netip.MustParsePrefix(second)), metav1.GetOptions{}); err == nil {
				return fmt.Errorf("claim of %s still exists", second)
			}
			_, err := e.checkBlocks()
			return err
		})
	})

	t.Run("DeletedNodeReclaimedAfterItsEndpoints", func(t *testing.T) {
		e.t = t
		e.pool("reclaim", coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.30.0.0/16"}, NodeSelector: sel("reclaim")})
		node := e.nodes("reclaim", 1, sel("reclaim"))[0]
		e.namespace("reclaim", nil)
		c := e.start(testOptions(), "reclaim")
		defer c.stop()
		var block string
		e.eventually("a block", 20*time.Second, func() error {
			nc, err := e.nodeConfig(node)
			if err != nil || len(nc.Spec.Blocks) != 1 {
				return fmt.Errorf("%v", err)
			}
			block = nc.Spec.Blocks[0].CIDR
			return nil
		})
		e.pod("reclaim", "p1", node, map[string]string{"app": "x"})
		e.report(node, map[string]int32{block: 1}, -1)
		if err := e.core.CoreV1().Nodes().Delete(e.ctx, node, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		claim := coordinov1alpha1.BlockName(netip.MustParsePrefix(block))
		e.never("blocks reclaimed while a pod of the node remains", 3*time.Second, func() error {
			if _, err := e.crd.CoordinoV1alpha1().IPBlocks().Get(e.ctx, claim, metav1.GetOptions{}); err != nil {
				return nil
			}
			return fmt.Errorf("claim kept")
		})
		e.deletePod("reclaim", "p1")
		e.eventually("NodeConfig and claim gone", 20*time.Second, func() error {
			if _, err := e.nodeConfig(node); err == nil {
				return fmt.Errorf("NodeConfig still there")
			}
			if _, err := e.crd.CoordinoV1alpha1().IPBlocks().Get(e.ctx, claim, metav1.GetOptions{}); err == nil {
				return fmt.Errorf("claim still there")
			}
			return nil
		})
	})

	t.Run("PoolExhaustion", func(t *testing.T) {
		e.t = t
		// A /24 holds four /26 blocks: the fifth node waits.
		e.pool("small", coordinov1alpha1.IPPoolSpec{CIDRs: []string{"10.40.0.0/24"}, NodeSelector: sel("small")})
		nodes := e.nodes("small", 5, sel("small"))
		c := e.start(testOptions(), "small")
		defer c.stop()
		e.eventually("Exhausted condition and Event", 30*time.Second, func() error {
			p, err := e.crd.CoordinoV1alpha1().IPPools().Get(e.ctx, "small", metav1.GetOptions{})
			if err != nil {
				return err
			}
			cond := findCondition(p.Status.Conditions, coordinov1alpha1.ConditionExhausted)
			if cond == nil || cond.Status != metav1.ConditionTrue || p.Status.AllocatedBlocks != 4 {
				return fmt.Errorf("status %+v", p.Status)
			}
			evs, err := e.core.CoreV1().Events("").List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=small,reason=PoolExhausted"})
			if err != nil || len(evs.Items) == 0 {
				return fmt.Errorf("no PoolExhausted event (%v)", err)
			}
			if !strings.Contains(evs.Items[0].Message, "node small-") {
				return fmt.Errorf("event %q does not name the waiting node", evs.Items[0].Message)
			}
			return nil
		})
		// Free a node's block: the waiting node gets it, the condition clears.
		per, err := e.checkBlocks()
		if err != nil {
			t.Fatal(err)
		}
		var victim, waiting string
		for _, n := range nodes {
			if len(per[n]) == 0 {
				waiting = n
			} else if victim == "" {
				victim = n
			}
		}
		if err := e.core.CoreV1().Nodes().Delete(e.ctx, victim, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.eventually("waiting node served, condition cleared", 30*time.Second, func() error {
			per, err := e.checkBlocks()
			if err != nil {
				return err
			}
			if len(per[waiting]) != 1 {
				return fmt.Errorf("waiting node %s has %v", waiting, per[waiting])
			}
			p, _ := e.crd.CoordinoV1alpha1().IPPools().Get(e.ctx, "small", metav1.GetOptions{})
			if cond := findCondition(p.Status.Conditions, coordinov1alpha1.ConditionExhausted); cond == nil || cond.Status != metav1.ConditionFalse {
				return fmt.Errorf("condition %+v", cond)
			}
			return nil
		})
	})

	// Last: a kubernetes-mode controller owns every node's spec.
	t.Run("IPAMKubernetes", func(t *testing.T) {
		e.t = t
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "podcidr-0"},
			Spec: corev1.NodeSpec{PodCIDR: "10.50.3.0/24", PodCIDRs: []string{"10.50.3.0/24", "fd00:50:3::/64"}}}
		if _, err := e.core.CoreV1().Nodes().Create(e.ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		o := testOptions()
		o.IPAM = IPAMKubernetes
		c := e.start(o, "k8s-ipam")
		defer c.stop()
		e.eventually("NodeConfig mirrors podCIDRs", 20*time.Second, func() error {
			nc, err := e.nodeConfig("podcidr-0")
			if err != nil {
				return err
			}
			want := []coordinov1alpha1.NodeBlock{{CIDR: "10.50.3.0/24", Pool: coordinov1alpha1.PodCIDRsPool}, {CIDR: "fd00:50:3::/64", Pool: coordinov1alpha1.PodCIDRsPool}}
			if fmt.Sprint(nc.Spec.Blocks) != fmt.Sprint(want) {
				return fmt.Errorf("blocks %+v", nc.Spec.Blocks)
			}
			return nil
		})
	})
}

func findCondition(cs []metav1.Condition, typ string) *metav1.Condition {
	for i := range cs {
		if cs[i].Type == typ {
			return &cs[i]
		}
	}
	return nil
}
