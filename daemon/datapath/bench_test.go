package datapath

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/kernel"
)

// BenchmarkVerdict times the endpoint programs per packet in the kernel
// (BPF_PROG_TEST_RUN with repeat), for the common packet kinds.
func BenchmarkVerdict(b *testing.B) {
	c := newCluster(b, AttachTC)
	c.policies(serverIngress, clientEgress, clientDenyIngress)
	a4, b4, c4 := podIPs["a"], podIPs["b"], podIPs["c"]
	if !c.fromPod("a", frame(a4, b4, protoTCP, tcp(40000, 80, tcpSYN))) {
		b.Fatal("SYN a>b dropped")
	}
	for _, bc := range []struct {
		name string
		prog *ebpf.Program
		pod  string
		f    []byte
	}{
		{"established-tcp-isolated", c.dp.objs.CdoFromEp, "a", frame(a4, b4, protoTCP, tcp(40000, 80, tcpACK))},
		{"reply-tcp-isolated", c.dp.objs.CdoToEp, "a", frame(b4, a4, protoTCP, tcp(80, 40000, tcpACK))},
		{"new-flow-denied", c.dp.objs.CdoToEp, "b", frame(podIPs["ext"], b4, protoTCP, tcp(1234, 81, tcpSYN))},
		{"udp-not-isolated", c.dp.objs.CdoFromEp, "c", frame(c4, b4, protoUDP, udp(5353, 53, []byte("q")))},
		{"tcp-not-isolated", c.dp.objs.CdoFromEp, "c", frame(c4, a4, protoTCP, tcp(5353, 53, tcpACK))},
	} {
		b.Run(bc.name, func(b *testing.B) {
			// Program.Benchmark takes no context (the ifindex), so time Run:
			// the syscall is amortised over the repeats.
			const repeat = 10000
			opts := &ebpf.RunOptions{Data: bc.f, Repeat: repeat,
				Context: skbContext{Ifindex: uint32(c.eps[bc.pod].HostIfIndex)}}
			start := time.Now()
			for b.Loop() {
				if _, err := bc.prog.Run(opts); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*repeat), "ns/pkt")
		})
	}
}

// BenchmarkVerdictTiers times new-flow decisions (denied, so every packet
// is decided anew) without and with 1,000 ClusterNetworkPolicies loaded:
// a NetworkPolicy deny at an endpoint no cluster policy names (the
// untiered path), the same deny at a tiered endpoint (Admin lookups, then
// NetworkPolicy), and a Baseline deny (Admin, then Baseline lookups: the
// six-lookup worst case).
func BenchmarkVerdictTiers(b *testing.B) {
	c := newCluster(b, AttachTC)
	ext, b4, c4 := podIPs["ext"], podIPs["b"], podIPs["c"]
	npDenied := frame(ext, b4, protoTCP, tcp(1234, 81, tcpSYN))
	baselineDenied := frame(c4, ext, protoTCP, tcp(1234, 80, tcpSYN))
	var cnps []string
	for i := range 1000 {
		cnps = append(cnps, fmt.Sprintf(`kind: ClusterNetworkPolicy
metadata: {name: c%d}
spec:
  tier: %s
  priority: %d
  subject: {namespaces: {matchLabels: {team: t%d}}}
  ingress: [{action: Deny, from: [{namespaces: {matchLabels: {team: t%d}}}]}]
  egress: [{action: Accept, to: [{networks: [10.%d.%d.0/24]}], protocols: [{tcp: {destinationPort: {range: {start: 8000, end: 8999}}}}]}]`,
			i, []string{"Admin", "Baseline"}[i%2], i%1000, i%50, (i+7)%50, 200+i/256%50, i%256))
	}
	tiered := append(slices.Clone(cnps), `kind: ClusterNetworkPolicy
metadata: {name: server-pass}
spec:
  tier: Admin
  priority: 5
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: server}}}}
  ingress: [{action: Pass, from: [{namespaces: {}}]}]`, `kind: ClusterNetworkPolicy
metadata: {name: other-baseline}
spec:
  tier: Baseline
  priority: 5
  subject: {namespaces: {matchLabels: {kubernetes.io/metadata.name: other}}}
  egress: [{action: Deny, to: [{networks: [203.0.113.0/24]}]}]`)
	run := func(b *testing.B, prog *ebpf.Program, pod string, f []byte) {
		const repeat = 10000
		opts := &ebpf.RunOptions{Data: f, Repeat: repeat, Context: skbContext{Ifindex: uint32(c.eps[pod].HostIfIndex)}}
		start := time.Now()
		for b.Loop() {
			if _, err := prog.Run(opts); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*repeat), "ns/pkt")
	}
	c.policies(serverIngress)
	b.Run("np-denied", func(b *testing.B) { run(b, c.dp.objs.CdoToEp, "b", npDenied) })
	c.policies(append(tiered, serverIngress)...)
	if c.fromPod("c", baselineDenied) {
		b.Fatal("the Baseline deny c>ext passed")
	}
	b.Run("np-denied-1000-cnp", func(b *testing.B) { run(b, c.dp.objs.CdoToEp, "b", npDenied) })
	b.Run("baseline-denied-1000-cnp", func(b *testing.B) { run(b, c.dp.objs.CdoFromEp, "c", baselineDenied) })
}

// BenchmarkServiceConnect times TCP connections (connect, one echo, close)
// from egress-isolated pod a to b, directly and through a Service address
// DNATed by nftables, with and without Service CIDRs (the post-DNAT hook).
// Wall time per connection is at the machine's mercy; the kernel's BPF run
// statistics give each program's own time per run, and the post-DNAT
// program's is printed as a ratio to the tc program's (cdo_from_ep) in the
// same traffic.
func BenchmarkServiceConnect(b *testing.B) {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enable BPF run statistics: %v", err)
	}
	defer stats.Close()
	all := kernel.Probe()
	nftStage := all.Without(kernel.NetfilterLink)
	for _, bc := range []struct {
		name     string
		cidrs    []netip.Prefix
		svc      bool
		features *kernel.Features
	}{
		{"direct/no-hook", nil, false, all},
		{"direct/hook", []netip.Prefix{svcCIDR}, false, all},
		{"direct/nftables-stage", []netip.Prefix{svcCIDR}, false, nftStage},
		{"service/judged-on-clusterip", nil, true, all},
		{"service/post-dnat-hook", []netip.Prefix{svcCIDR}, true, all},
		{"service/nftables-stage", []netip.Prefix{svcCIDR}, true, nftStage},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := newClusterWith(b, Config{AttachMode: AttachTC, ServiceCIDRs: bc.cidrs, Features: bc.features}, false)
			nftDNAT(b, "ip", svcIP.String(), podIPs["b"].String(), 80)
			// The ipBlock rule is what the Service path needs without the hook.
			c.policies(`
metadata: {name: client-egress, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress:
  - to: [{podSelector: {matchLabels: {app: server}}}]
    ports: [{protocol: TCP, port: 80}]
  - to: [{ipBlock: {cidr: 10.96.0.0/16}}]
    ports: [{protocol: TCP, port: 8080}]`)
			dst, port := podIPs["b"], 80
			if bc.svc {
				dst, port = svcIP, 8080
			}
			progs := map[string]*ebpf.Program{"tc": c.dp.objs.CdoFromEp}
			switch {
			case bc.cidrs == nil:
			case bc.features == nftStage:
				progs["nf"] = programNamed(b, "cdo_svc_match")
			default:
				progs["nf"] = pinnedServiceProgram(b, c)
			}
			before := progStats(b, progs)
			start := time.Now()
			for b.Loop() {
				conn, err := c.pods["a"].Dial(dst, port)
				if err != nil {
					b.Fatal(err)
				}
				if err := testnet.Echo(conn); err != nil {
					b.Fatal(err)
				}
				conn.Close()
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N), "ns/conn")
			after := progStats(b, progs)
			perRun := map[string]float64{}
			for name := range progs {
				runs := after[name].RunCount - before[name].RunCount
				if runs > 0 {
					perRun[name] = float64(after[name].Runtime-before[name].Runtime) / float64(runs)
					b.ReportMetric(perRun[name], name+"-ns/run")
				}
			}
			if perRun["nf"] > 0 && perRun["tc"] > 0 {
				b.ReportMetric(perRun["nf"]/perRun["tc"], "nf/tc")
			}
		})
	}
}

// pinnedServiceProgram opens the post-DNAT program through its pinned link.
func pinnedServiceProgram(b *testing.B, c *cluster) *ebpf.Program {
	l, err := link.LoadPinnedLink(filepath.Join(c.cfg.BPFDir, "links", "service-ipv4"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		b.Fatal(err)
	}
	p, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	return p
}

// programNamed opens the newest loaded program called name: the nftables
// stage's match program, which no pin names.
func programNamed(b *testing.B, name string) *ebpf.Program {
	var newest *ebpf.Program
	for id, err := ebpf.ProgramGetNextID(0); err == nil; id, err = ebpf.ProgramGetNextID(id) {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		if info, err := p.Info(); err == nil && info.Name == name {
			if newest != nil {
				newest.Close()
			}
			newest = p
			continue
		}
		p.Close()
	}
	if newest == nil {
		b.Fatalf("no program %s loaded", name)
	}
	b.Cleanup(func() { newest.Close() })
	return newest
}

func progStats(b *testing.B, progs map[string]*ebpf.Program) map[string]ebpf.ProgramStats {
	out := map[string]ebpf.ProgramStats{}
	for name, p := range progs {
		st, err := p.Stats()
		if err != nil {
			b.Fatal(err)
		}
		out[name] = *st
	}
	return out
}
