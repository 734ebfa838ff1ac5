//go:build benchmultinode

package multinode

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/daemon/wireguard"
)

// TestBenchWireGuardPath takes the userspace WireGuard path apart: in one
// cluster, interleaved with the bare wireguard-go tunnel between the same
// node namespaces, it measures pod -> pod, node -> remote pod (no sending
// veth) and pod -> pod with the node-to-node policy-routing rule removed,
// so each hop's share of the gap shows in one run. Like TestBenchMultinode
// it asserts nothing (go test -tags benchmultinode).
func TestBenchWireGuardPath(t *testing.T) {
	c := newCluster(t, wgUser, 2)
	src, dst := c.addPod(c.nodes[0]), c.addPod(c.nodes[1])
	bare := bareTunnel(t, c)
	n0, n1 := c.nodes[0].NS, c.nodes[1].NS
	var rows []string
	row := func(name string, from, to ns.NetNS, addr netip.Addr) {
		for _, streams := range []int{1, 4} {
			r := interleaved(func() float64 { return iperf(t, from, to, addr, streams) },
				func() float64 { return iperf(t, n0, n1, bare, streams) })
			rows = append(rows, fmt.Sprintf("| %s | %d | %.2f Gbit/s | %.2f Gbit/s | %.2f× |", name, streams, r.got/1e9, r.ref/1e9, r.ratio))
		}
	}
	row("pod -> pod", src.NS, dst.NS, dst.addr(false))
	row("node -> remote pod", n0, dst.NS, dst.addr(false))
	row("node -> node through Coordino's device", n0, n1, c.nodes[1].address(false))
	// The rule's own share: with and without it, alternating.
	for _, streams := range []int{1, 4} {
		r := interleaved(func() float64 {
			setNodeRules(t, c, false)
			defer setNodeRules(t, c, true)
			return iperf(t, src.NS, dst.NS, dst.addr(false), streams)
		}, func() float64 { return iperf(t, src.NS, dst.NS, dst.addr(false), streams) })
		rows = append(rows, fmt.Sprintf("| pod -> pod without / with the node-to-node rule | %d | %.2f Gbit/s | %.2f Gbit/s (with) | %.2f× |", streams, r.got/1e9, r.ref/1e9, r.ratio))
	}
	t.Logf("\n| path | streams | path | bare wireguard-go | ratio |\n|---|---|---|---|---|\n%s", joinLines(rows))
}

// setNodeRules removes or restores the node-to-node steering rule on every
// node ("not fwmark lookup NodeTable").
func setNodeRules(t *testing.T, c *cluster, present bool) {
	t.Helper()
	for _, n := range c.nodes {
		if err := n.NS.Do(func(ns.NetNS) error {
			for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
				rules, err := netlink.RuleList(fam)
				if err != nil {
					return err
				}
				for _, r := range rules {
					if r.Table == wireguard.NodeTable && !present {
						if err := netlink.RuleDel(&r); err != nil {
							return err
						}
					}
				}
				if present {
					mask := uint32(0xffffffff)
					r := netlink.NewRule()
					r.Family, r.Priority, r.Table, r.Mark, r.Mask, r.Invert = fam, 99, wireguard.NodeTable, wireguard.FirewallMark, &mask, true
					if err := netlink.RuleAdd(r); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}
