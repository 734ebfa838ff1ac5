package datapath

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
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
