//go:build benchmultinode

package multinode

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/test/stats"
)

// cfgHostRouting is CFG_HOST_ROUTING of bpf/coordino.h.
const cfgHostRouting = 4

// TestBenchHostRouting is host routing's same-run A/B: per routing mode, one
// cluster, and every round measures the underlay, then pod to pod with host
// routing on, then with it off (the flag flipped in both nodes' pinned
// config map, as --host-routing=legacy would leave it), so the machine's
// load drifting between runs cancels out of the on/off quotient.
func TestBenchHostRouting(t *testing.T) {
	var rows []string
	for _, m := range []mode{direct, vxlan} {
		t.Run(m.name, func(t *testing.T) {
			c := newCluster(t, m, 2)
			src, dst := c.addPod(c.nodes[0]), c.addPod(c.nodes[1])
			tests := []struct {
				name string
				run  func(from, to ns.NetNS, addr netip.Addr) float64
			}{
				{"TCP 1 stream, Gbit/s", func(from, to ns.NetNS, addr netip.Addr) float64 { return iperf(t, from, to, addr, 1) / 1e9 }},
				{"TCP 4 streams, Gbit/s", func(from, to ns.NetNS, addr netip.Addr) float64 { return iperf(t, from, to, addr, 4) / 1e9 }},
				{"TCP 1 stream, whole-segment writes, Gbit/s", func(from, to ns.NetNS, addr netip.Addr) float64 {
					return iperf(t, from, to, addr, 1, wholeSegments(t, from, addr)...) / 1e9
				}},
				{"TCP 4 streams, whole-segment writes, Gbit/s", func(from, to ns.NetNS, addr netip.Addr) float64 {
					return iperf(t, from, to, addr, 4, wholeSegments(t, from, addr)...) / 1e9
				}},
				{"TCP request/response, /s", func(from, to ns.NetNS, addr netip.Addr) float64 { return requestRate(t, from, to, addr) }},
			}
			for _, test := range tests {
				var under, on, off []float64
				for i := 0; i < benchRounds(); i++ {
					under = append(under, test.run(c.nodes[0].NS, c.nodes[1].NS, c.nodes[1].address(false)))
					setHostRouting(t, c, true)
					on = append(on, test.run(src.NS, dst.NS, dst.addr(false)))
					setHostRouting(t, c, false)
					off = append(off, test.run(src.NS, dst.NS, dst.addr(false)))
				}
				setHostRouting(t, c, true)
				bpfVsUnder, legacyVsUnder, bpfVsLegacy := summarise(on, under), summarise(off, under), summarise(on, off)
				rows = append(rows, fmt.Sprintf("| %s | %s | %.2f | %.2f | %.2f | %.2f× (%.2f–%.2f) | %.2f× (%.2f–%.2f) | %.2f× (%.2f–%.2f) |",
					m.name, test.name, stats.Median(under), stats.Median(on), stats.Median(off),
					bpfVsUnder.ratio, bpfVsUnder.ratioLo, bpfVsUnder.ratioHi,
					legacyVsUnder.ratio, legacyVsUnder.ratioLo, legacyVsUnder.ratioHi,
					bpfVsLegacy.ratio, bpfVsLegacy.ratioLo, bpfVsLegacy.ratioHi))
			}
		})
	}
	t.Logf("\n%d rounds of %d s per path; medians, per-round ratios' median (range)\n| mode | test | underlay | host routing bpf | legacy | bpf / underlay | legacy / underlay | bpf / legacy |\n|---|---|---|---|---|---|---|---|\n%s",
		benchRounds(), benchSeconds(), joinLines(rows))
}

// setHostRouting flips CFG_HOST_ROUTING in every node's pinned config map.
func setHostRouting(t *testing.T, c *cluster, on bool) {
	t.Helper()
	for _, n := range c.nodes {
		m, err := ebpf.LoadPinnedMap(filepath.Join(n.BPFDir, bpf.CoordinoMapCdoConfig), nil)
		if err != nil {
			t.Fatal(err)
		}
		var cfg bpf.CoordinoConfig
		if err := m.Lookup(uint32(0), &cfg); err != nil {
			t.Fatal(err)
		}
		cfg.Flags &^= cfgHostRouting
		if on {
			cfg.Flags |= cfgHostRouting
		}
		if err := m.Update(uint32(0), &cfg, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
}
