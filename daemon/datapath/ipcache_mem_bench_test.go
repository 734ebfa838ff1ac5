package datapath

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/test/privileged"
)

// BenchmarkIpcacheKernelMemory measures what the ipcache (an LPM trie
// without preallocation) costs the kernel at the sizes --ipcache-map-size
// is sized for: an empty map of each capacity, and maps holding one
// dual-stack cluster's pod addresses (two entries per pod). Reported: the
// map's memlock (the kernel's own accounting, fdinfo) and the growth of
// the kernel's slab (/proc/meminfo, so other activity on the machine adds
// noise), per map and per entry.
func BenchmarkIpcacheKernelMemory(b *testing.B) {
	privileged.Require(b)
	spec, err := bpf.LoadCoordino()
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ capacity, pods int }{
		{1 << 18, 0}, {1 << 21, 0}, {1 << 18, 110_000}, {1 << 21, 110_000}, {1 << 21, 550_000},
	} {
		b.Run(fmt.Sprintf("capacity=%d/pods=%d", c.capacity, c.pods), func(b *testing.B) {
			for b.Loop() {
				ms := spec.Maps[bpf.CoordinoMapCdoIpcache].Copy()
				ms.MaxEntries, ms.Pinning = uint32(c.capacity), ebpf.PinNone
				slab0 := slabKiB(b)
				m, err := ebpf.NewMap(ms)
				if err != nil {
					b.Fatal(err)
				}
				v := bpf.CoordinoIpcacheValue{Identity: 300}
				for i := 0; i < c.pods; i++ {
					for _, a := range []netip.Addr{benchPodAddr(i, false), benchPodAddr(i, true)} {
						k := ipcacheKey(netip.PrefixFrom(a, a.BitLen()))
						if err := m.Update(&k, &v, ebpf.UpdateAny); err != nil {
							b.Fatalf("entry %d: %v", 2*i, err)
						}
					}
				}
				memlock := fdinfoMemlock(b, m)
				slab := slabKiB(b) - slab0
				m.Close()
				b.ReportMetric(float64(memlock)/(1<<20), "memlock-MiB")
				b.ReportMetric(float64(slab)/1024, "slab-MiB")
				if c.pods > 0 {
					b.ReportMetric(float64(memlock)/float64(2*c.pods), "memlock-B/entry")
					b.ReportMetric(float64(slab)*1024/float64(2*c.pods), "slab-B/entry")
				}
			}
		})
	}
}

// benchPodAddr is the i-th pod of a cluster with /24 (IPv4) and /64 (IPv6)
// node blocks of 110 pods.
func benchPodAddr(i int, v6 bool) netip.Addr {
	node, pod := i/110, i%110+1
	if v6 {
		return netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x10, 4: byte(node >> 8), 5: byte(node), 15: byte(pod)})
	}
	return netip.AddrFrom4([4]byte{10, byte(node >> 8), byte(node), byte(pod)})
}

func fdinfoMemlock(b *testing.B, m *ebpf.Map) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/self/fdinfo/%d", m.FD()))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "memlock:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no memlock in fdinfo")
	return 0
}

func slabKiB(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Slab:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no Slab in /proc/meminfo")
	return 0
}
