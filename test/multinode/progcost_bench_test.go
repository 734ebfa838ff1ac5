//go:build benchmultinode

package multinode

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// TestBenchProgramCost measures what Coordino's programs cost per run on
// the real cross-node path, from the kernel's BPF run statistics: per
// routing mode, one two-node cluster, pod-to-pod request/response and one
// TCP stream, then the same between the node namespaces (the underlay,
// where only the node programs run). End-to-end ratios (TestBenchMultinode)
// move by a few percent between runs; a program's time per run does not,
// so this is the figure to compare when changing what a packet costs.
// Run statistics add two clock reads to every run: a program that returns
// at once costs their price. Counts every cdo_* program on the machine, so
// run it alone. Asserts nothing (go test -tags benchmultinode -run
// TestBenchProgramCost).
func TestBenchProgramCost(t *testing.T) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Fatalf("enable BPF run statistics: %v", err)
	}
	defer stats.Close()
	var rows []string
	for _, m := range []mode{direct, vxlan} {
		t.Run(m.name, func(t *testing.T) {
			c := newCluster(t, m, 2)
			src, dst := c.addPod(c.nodes[0]), c.addPod(c.nodes[1])
			paths := []struct {
				name     string
				from, to ns.NetNS
				addr     netip.Addr
			}{
				{"pod to pod", src.NS, dst.NS, dst.addr(false)},
				{"underlay", c.nodes[0].NS, c.nodes[1].NS, c.nodes[1].address(false)},
			}
			for _, w := range []struct {
				name string
				run  func(from, to ns.NetNS, addr netip.Addr)
			}{
				{"request/response", func(from, to ns.NetNS, addr netip.Addr) { requestRate(t, from, to, addr) }},
				{"TCP 1 stream", func(from, to ns.NetNS, addr netip.Addr) { iperf(t, from, to, addr, 1) }},
			} {
				for _, path := range paths {
					before := programStats(t)
					for i := 0; i < benchRounds(); i++ {
						w.run(path.from, path.to, path.addr)
					}
					for _, p := range programCosts(before, programStats(t)) {
						rows = append(rows, fmt.Sprintf("| %s | %s, %s | %s | %d | %.0f |", m.name, w.name, path.name, p.name, p.runs, p.nsPerRun))
					}
				}
			}
		})
	}
	t.Logf("\n%d rounds per figure; BPF run statistics on (two clock reads added to every run)\n| mode | traffic | program | runs | ns per run |\n|---|---|---|---|---|\n%s", benchRounds(), joinLines(rows))
}

// programStat is the kernel's running total for one program name, summed
// over every loaded program of that name (one per node).
type programStat struct {
	runtime time.Duration
	runs    uint64
}

// programStats reads the run statistics of every loaded cdo_* program.
func programStats(t *testing.T) map[string]programStat {
	t.Helper()
	out := map[string]programStat{}
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return out
		}
		if err != nil {
			t.Fatalf("list BPF programs: %v", err)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		info, ierr := p.Info()
		st, serr := p.Stats()
		p.Close()
		if ierr != nil || serr != nil || !strings.HasPrefix(info.Name, "cdo_") {
			continue
		}
		s := out[info.Name]
		s.runtime += st.Runtime
		s.runs += st.RunCount
		out[info.Name] = s
	}
}

type programCost struct {
	name     string
	runs     uint64
	nsPerRun float64
}

// programCosts is what each program that ran between two readings cost per
// run, by name.
func programCosts(before, after map[string]programStat) []programCost {
	var out []programCost
	for name, a := range after {
		b := before[name]
		if a.runs <= b.runs {
			continue
		}
		runs := a.runs - b.runs
		out = append(out, programCost{name, runs, float64(a.runtime-b.runtime) / float64(runs)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}
