package datapath

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/test/policygen"
	"github.com/coordino/coordino/test/privileged"
)

// Cluster shape of BenchmarkNodeCost: what a daemon receives in Kubernetes
// mode at 550,000 pods, and the pods it runs.
const (
	costNamespaces = 2000
	costPolicies   = 10000
	costLocalPods  = 110
	// costLocalNamespaces spread the node's pods (10 a namespace).
	costLocalNamespaces = 11
)

// BenchmarkNodeCost measures what 10,000 cluster policies cost one node
// with 110 pods, on the real datapath: every PolicyIR (test/policygen's
// shapes over 2,000 namespaces) and every cluster Identity (20,000 label
// sets, announced as the Identity informer does) loaded, then 110 pods of
// 11 namespaces attached with their named ports. It reports the heap and
// RSS growth (after GC; they include the PolicyIR objects, as the informer
// cache holds them), the entries of the real policy and ipcache maps, and
// the load times. The reference, in the same run, is the same node with no
// policy.
//
//	go test -run '^$' -bench '^BenchmarkNodeCost$' -benchtime 1x ./daemon/datapath/   (root)
func BenchmarkNodeCost(b *testing.B) {
	privileged.Require(b)
	var ref nodeCost
	for _, n := range []int{0, costPolicies} {
		b.Run(fmt.Sprintf("policies=%d", n), func(b *testing.B) {
			for range b.N {
				c := measureNodeCost(b, n)
				if n == 0 {
					ref = c
				}
				b.ReportMetric(c.heapMiB, "MiB-heap-growth")
				b.ReportMetric(c.rssMiB, "MiB-rss-growth")
				b.ReportMetric(float64(c.policyEntries), "policy-map-entries")
				b.ReportMetric(float64(c.ipcacheEntries), "ipcache-entries")
				b.ReportMetric(c.load.Seconds(), "s-policies")
				b.ReportMetric(c.attach.Seconds(), "s-attach-110")
				b.Logf("%d policies: heap +%.0f MiB, RSS +%.0f MiB; policy map %d entries, ipcache %d; load policies %v, announce 20,000 identities %v, attach 110 pods %v",
					n, c.heapMiB, c.rssMiB, c.policyEntries, c.ipcacheEntries, c.load.Round(time.Millisecond), c.announce.Round(time.Millisecond), c.attach.Round(time.Millisecond))
				if n > 0 && ref.attach > 0 {
					b.Logf("against no policy in the same run: heap %.1fx, attach 110 pods %.2fx, policy map entries %d vs %d",
						c.heapMiB/max(ref.heapMiB, 1), c.attach.Seconds()/ref.attach.Seconds(), c.policyEntries, ref.policyEntries)
				}
			}
		})
	}
}

type nodeCost struct {
	heapMiB, rssMiB               float64
	policyEntries, ipcacheEntries int
	load, announce, attach        time.Duration
}

func measureNodeCost(b *testing.B, policies int) nodeCost {
	var c nodeCost
	heap0, rss0 := settledMemory()
	dp, err := Open(Config{BPFDir: testnet.BPFDir(b), Logger: zap.NewNop(), NodeIPs: []netip.Addr{testnet.NodeIP}})
	if err != nil {
		b.Fatal(err)
	}
	defer dp.Close()

	var snap policy.Snapshot
	for ns := range costNamespaces {
		snap.Namespaces = append(snap.Namespaces, policygen.Namespace(ns))
	}
	for i := range policies {
		np := policygen.NetworkPolicy(i%costNamespaces, i/costNamespaces)
		spec, err := policyir.Compile(np)
		if err != nil {
			b.Fatal(err)
		}
		snap.PolicyIRs = append(snap.PolicyIRs, &coordinov1alpha1.PolicyIR{
			ObjectMeta: metav1.ObjectMeta{Namespace: np.Namespace, Name: np.Name}, Spec: *spec})
	}
	start := time.Now()
	if err := dp.UpdatePolicy(snap); err != nil {
		b.Fatal(err)
	}
	c.load = time.Since(start)

	start = time.Now()
	// Above the numbers the node's own allocator gives its endpoints.
	next := identity.FirstPod + 100000
	for ns := range costNamespaces {
		for app := range policygen.AppsPerNamespace {
			if err := dp.UpsertIdentity(identity.Identity{ID: next, Namespace: policygen.NamespaceName(ns), Labels: policygen.PodLabels(app)}); err != nil {
				b.Fatal(err)
			}
			next++
		}
	}
	c.announce = time.Since(start)

	pods := make([]*testnet.Pod, costLocalPods)
	for i := range pods {
		pods[i] = testnet.NewPod(b, fmt.Sprint("cost", i), netip.AddrFrom4([4]byte{10, 77, byte(i / 250), byte(i%250 + 1)}))
	}
	var ports []policy.NamedPort
	for name, p := range policygen.NamedPorts {
		ports = append(ports, policy.NamedPort{Name: name, Protocol: policy.ProtoTCP, Port: uint16(p)})
	}
	start = time.Now()
	for i, p := range pods {
		ns := policygen.NamespaceName(i % costLocalNamespaces)
		pod := fmt.Sprintf("%s/pod-%d", ns, i)
		if err := dp.SetPodNamedPorts(pod, ports); err != nil {
			b.Fatal(err)
		}
		ep := Endpoint{Key: fmt.Sprintf("net/cost%d/eth0", i), HostIfName: p.HostIfName, HostIfIndex: p.HostIfIndex, IPs: p.IPs,
			Namespace: ns, Labels: policygen.PodLabels(i / costLocalNamespaces % policygen.AppsPerNamespace), Pod: pod}
		if err := dp.AttachEndpoint(ep); err != nil {
			b.Fatal(err)
		}
		defer func() { _ = dp.DetachEndpoint(ep) }()
	}
	c.attach = time.Since(start)

	// Read back from the kernel's maps, not the daemon's mirror of them.
	inKernel, err := readMirrors(dp.mw.maps)
	if err != nil {
		b.Fatal(err)
	}
	c.policyEntries, c.ipcacheEntries = len(inKernel.policy), len(inKernel.ipcache)
	if c.policyEntries != len(dp.mw.mirror.policy) {
		b.Fatalf("policy map holds %d entries, the mirror %d", c.policyEntries, len(dp.mw.mirror.policy))
	}
	heap1, rss1 := settledMemory()
	runtime.KeepAlive(snap) // the informer cache holds the objects
	c.heapMiB, c.rssMiB = float64(heap1-heap0)/(1<<20), float64(rss1-rss0)/(1<<20)
	return c
}

// settledMemory returns the heap in use and the process RSS after a GC
// that returns freed memory to the OS.
func settledMemory() (heap, rss int64) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	data, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			rss = kb << 10
		}
	}
	return int64(ms.HeapAlloc), rss
}
