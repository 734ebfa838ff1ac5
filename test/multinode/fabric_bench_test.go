//go:build benchmultinode

package multinode

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// fabricScale is how many blocks the router announces besides the nodes'.
const fabricScale = 5000

// TestBenchFabricBGP: cross-rack pod-to-pod TCP against the routed underlay
// between the same node namespaces (interleaved rounds), a node's new block
// to every other node's kernel, and a fresh node installing the fabric's
// 5,000 blocks. go test -tags benchmultinode -count=1 -v -run
// '^TestBenchFabricBGP$' ./test/multinode/
func TestBenchFabricBGP(t *testing.T) {
	f := newFabricWith(t, bgpMode, 3, fabricScale, false)
	n0, n2 := f.nodes[0], f.nodes[2]
	if err := f.waitRoutes(60*time.Second, f.nodes); err != nil {
		t.Fatal(err)
	}
	var rows []string
	src, dst := n0.pods[0], n2.pods[0]
	for _, streams := range []int{1, 4} {
		r := interleaved(func() float64 {
			return iperf(t, src.NS, dst.NS, dst.addr(false), streams, benchIperfArgs()...) / 1e9
		}, func() float64 {
			return iperf(t, n0.NS, n2.NS, n2.fabricAddr(false), streams, benchIperfArgs()...) / 1e9
		})
		rows = append(rows, benchRow("bgp", fmt.Sprintf("cross-rack TCP %d stream(s)", streams), "Gbit/s", "routed underlay", r, map[string]float64{}))
	}
	r := interleaved(func() float64 { return requestRate(t, src.NS, dst.NS, dst.addr(false)) },
		func() float64 { return requestRate(t, n0.NS, n2.NS, n2.fabricAddr(false)) })
	rows = append(rows, benchRow("bgp", "cross-rack request/response", "/s", "routed underlay", r, map[string]float64{}))

	// node0 restarts as a fresh node (no graceful restart, no routes) with
	// a block nobody has seen: time to that block in node2's kernel, and
	// to the fabric's blocks in node0's.
	if err := n0.StopDaemon(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(filepath.Join(n0.StateDir, "bgp.started"))
	if err := n0.NS.Do(func(ns.NetNS) error {
		krs, err := kernelRoutes(n0)
		for _, r := range krs {
			if err := netlink.RouteDel(&r); err != nil {
				return err
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	newBlock := "10.10.50.0/24"
	n0.ExtraArgs = append(n0.ExtraArgs, "--pod-cidr", newBlock)
	start := time.Now()
	if err := n0.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	serving := time.Since(start)
	var first, blockSeen time.Duration
	deadline := time.Now().Add(120 * time.Second)
	for time.Now().Before(deadline) {
		krs0, err := kernelRoutes(n0)
		if err != nil {
			t.Fatal(err)
		}
		if first == 0 && len(krs0) > 0 {
			first = time.Since(start)
		}
		if blockSeen == 0 {
			krs2, err := kernelRoutes(n2)
			if err != nil {
				t.Fatal(err)
			}
			for p := range krs2 {
				if p.String() == newBlock {
					blockSeen = time.Since(start)
				}
			}
		}
		if len(krs0) >= fabricScale && blockSeen > 0 {
			all := time.Since(start)
			rows = append(rows,
				fmt.Sprintf("| bgp | new block: daemon start → in the rack-2 node's kernel | %v (daemon serving after %v) |", blockSeen.Round(time.Millisecond), serving.Round(time.Millisecond)),
				fmt.Sprintf("| bgp | fresh node installs %d fabric blocks | first after %v, all after %v: %.0f routes/s |", len(krs0), first.Round(time.Millisecond), all.Round(time.Millisecond), float64(len(krs0))/(all-first).Seconds()))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(rows) < 5 {
		t.Errorf("node0 did not install %d routes and its new block did not reach node2 within 120 s", fabricScale)
	}
	t.Logf("\n%d interleaved rounds, iperf3 for %d s\n%s", benchRounds(), benchSeconds(), joinLines(rows))
}
