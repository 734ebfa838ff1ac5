package nftdp

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/datapath/dpapi"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/test/privileged"
)

// benchDatapath is what the benchmark needs of either datapath.
type benchDatapath interface {
	AttachEndpoint(dpapi.Endpoint) error
	UpdatePolicy(policy.Snapshot) error
}

// BenchmarkConnectThroughRules times TCP connections (connect, one echo,
// close) from pod a to pod b, with b's ingress open and with 10,000 rules
// isolating it (100 policies of 100 ipBlock peers each, plus the rule
// letting a in), on the eBPF and the nftables datapath in the same run;
// and the time the first snapshot of those rules took to apply.
//
//	go test ./daemon/nftdp/ -run XXX -bench BenchmarkConnectThroughRules -benchtime 2000x
func BenchmarkConnectThroughRules(b *testing.B) {
	privileged.Require(b)
	for _, kind := range []string{"ebpf", "nftables"} {
		for _, rules := range []int{0, 10000} {
			b.Run(fmt.Sprintf("%s/rules=%d", kind, rules), func(b *testing.B) {
				dp := openBench(b, kind)
				if err := dp.UpdatePolicy(policy.Snapshot{}); err != nil {
					b.Fatal(err)
				}
				pods := map[string]*testnet.Pod{}
				for name, labels := range map[string]string{"a": "client", "b": "server"} {
					p := testnet.NewPod(b, name, podIPs[name])
					pods[name] = p
					ep := dpapi.Endpoint{Key: "net/bench-" + name + "/eth0", HostIfName: p.HostIfName, HostIfIndex: p.HostIfIndex,
						IPs: p.IPs, Namespace: "default", Labels: map[string]string{"app": labels}}
					if err := dp.AttachEndpoint(ep); err != nil {
						b.Fatal(err)
					}
				}
				var apply time.Duration
				if rules > 0 {
					start := time.Now()
					if err := dp.UpdatePolicy(snapshotOf(b, manyRules(rules)...)); err != nil {
						b.Fatal(err)
					}
					apply = time.Since(start)
				}
				start := time.Now()
				for b.Loop() {
					conn, err := pods["a"].Dial(podIPs["b"], 80)
					if err != nil {
						b.Fatal(err)
					}
					if err := testnet.Echo(conn); err != nil {
						b.Fatal(err)
					}
					conn.Close()
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "conn/s")
				b.ReportMetric(float64(apply.Milliseconds()), "ms-apply")
			})
		}
	}
}

func openBench(b *testing.B, kind string) benchDatapath {
	if kind == "ebpf" {
		dp, err := datapath.Open(datapath.Config{BPFDir: testnet.BPFDir(b), AttachMode: datapath.AttachTC, Logger: zap.NewNop(),
			NodeIPs: []netip.Addr{testnet.NodeIP, testnet.NodeIP6}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { dp.Close() })
		return dp
	}
	dp, err := Open(Config{StateDir: filepath.Join(b.TempDir(), "nftables"), Logger: zap.NewNop(),
		NodeIPs: []netip.Addr{testnet.NodeIP, testnet.NodeIP6}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dp.Close(); _ = Remove() })
	return dp
}

// manyRules is n rules on the servers' ingress: policies of 100 ipBlock
// /32 peers each (10.200.0.0/16), and one letting clients in on port 80.
func manyRules(n int) []string {
	docs := []string{serverFromClientsOn80}
	for i := 0; i < n/100; i++ {
		var peers []string
		for j := range 100 {
			k := i*100 + j
			peers = append(peers, fmt.Sprintf("{ipBlock: {cidr: 10.200.%d.%d/32}}", k/256, k%256))
		}
		docs = append(docs, policyDoc(fmt.Sprintf("many-%d", i), "default", fmt.Sprintf(`  podSelector: {matchLabels: {app: server}}
  ingress:
  - from: [%s]
    ports: [{port: 80}]
`, strings.Join(peers, ", "))))
	}
	return docs
}

// BenchmarkPodChurn times pod churn: each round detaches the pod the last
// round attached while it attaches a new one, both at once as kubelet's
// DEL and ADD arrive, each pod a label set of its own that a policy
// isolates (its own verdict maps and chains). It reports the median DEL
// and ADD latencies.
//
//	go test ./daemon/nftdp/ -run XXX -bench BenchmarkPodChurn -benchtime 200x
func BenchmarkPodChurn(b *testing.B) {
	c := newCluster(b, false)
	c.policies(policyDoc("churn", "default", `  podSelector: {matchLabels: {app: churn}}
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{port: 80}]
`))
	ep := func(i int) dpapi.Endpoint {
		return dpapi.Endpoint{Key: fmt.Sprintf("net/churn-%d/eth0", i), HostIfName: fmt.Sprintf("cdch%d", i),
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{198, 51, 101, byte(i)})}, Namespace: "default",
			Labels: map[string]string{"app": "churn", "pod": fmt.Sprint(i)}}
	}
	if err := c.dp.AttachEndpoint(ep(0)); err != nil {
		b.Fatal(err)
	}
	dels, adds := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		var del, add time.Duration
		var derr, aerr error
		done := make(chan struct{})
		go func() {
			start := time.Now()
			derr = c.dp.DetachEndpoint(ep(i))
			del = time.Since(start)
			close(done)
		}()
		start := time.Now()
		aerr = c.dp.AttachEndpoint(ep(i + 1))
		add = time.Since(start)
		<-done
		if derr != nil || aerr != nil {
			b.Fatal(derr, aerr)
		}
		dels, adds = append(dels, del), append(adds, add)
	}
	b.StopTimer()
	median := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Microseconds()) / 1000
	}
	b.ReportMetric(median(dels), "del-p50-ms")
	b.ReportMetric(median(adds), "add-p50-ms")
}
