package netsetup

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/privileged"
)

func isLocalUnicast(mac net.HardwareAddr) bool {
	return len(mac) == 6 && mac[0]&0x02 != 0 && mac[0]&0x01 == 0
}

func findRoute(routes []netlink.Route, dst *net.IPNet, gw net.IP) *netlink.Route {
	for i, r := range routes {
		if hasRoute([]netlink.Route{r}, dst, gw) {
			return &routes[i]
		}
	}
	return nil
}

func findNeigh(neighs []netlink.Neigh, ip netip.Addr) *netlink.Neigh {
	for i, n := range neighs {
		if n.IP.Equal(ip.AsSlice()) {
			return &neighs[i]
		}
	}
	return nil
}

func TestSetupPodIPv4(t *testing.T) {
	privileged.Require(t)
	node := newNode(t)
	cfg := podCfg(t, "10.244.1.5/32")
	att := setup(t, node, cfg)

	if att.MTU != uplinkMTU {
		t.Errorf("MTU = %d, want the uplink's %d (DefaultMTU)", att.MTU, uplinkMTU)
	}
	if !isLocalUnicast(att.HostMAC) || !isLocalUnicast(att.PodMAC) || bytes.Equal(att.HostMAC, att.PodMAC) {
		t.Errorf("MACs host %s pod %s: want two distinct locally administered unicast MACs", att.HostMAC, att.PodMAC)
	}
	pod := netip.MustParseAddr("10.244.1.5")

	do(t, node, func() error {
		l, err := netlink.LinkByName(cfg.HostIfName)
		if err != nil {
			t.Fatalf("host veth: %v", err)
		}
		a := l.Attrs()
		if a.Index != att.HostIfIndex || a.ParentIndex != att.PodIfIndex || a.MTU != uplinkMTU ||
			a.Flags&net.FlagUp == 0 || !bytes.Equal(a.HardwareAddr, att.HostMAC) {
			t.Errorf("host veth %+v does not match attachment %+v", a, att)
		}
		routes, _ := netlink.RouteList(l, netlink.FAMILY_V4)
		if findRoute(routes, hostNet(pod), nil) == nil {
			t.Errorf("no scope-link host route to %s on %s: %+v", pod, cfg.HostIfName, routes)
		}
		neighs, _ := netlink.NeighList(a.Index, netlink.FAMILY_V4)
		if n := findNeigh(neighs, pod); n == nil || n.State != netlink.NUD_PERMANENT || !bytes.Equal(n.HardwareAddr, att.PodMAC) {
			t.Errorf("host neighbour %s: got %+v, want permanent -> %s", pod, n, att.PodMAC)
		}
		return nil
	})
	inPod(t, cfg, func() error {
		lo, _ := netlink.LinkByName("lo")
		if lo.Attrs().Flags&net.FlagUp == 0 {
			t.Error("lo is down in the pod")
		}
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Fatalf("pod eth0: %v", err)
		}
		a := l.Attrs()
		if a.Index != att.PodIfIndex || a.MTU != uplinkMTU || a.Flags&net.FlagUp == 0 || !bytes.Equal(a.HardwareAddr, att.PodMAC) {
			t.Errorf("pod eth0 %+v does not match attachment %+v", a, att)
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		if len(addrs) != 1 || addrs[0].IPNet.String() != "10.244.1.5/32" {
			t.Errorf("pod addresses = %v, want exactly 10.244.1.5/32", addrs)
		}
		routes, _ := netlink.RouteList(l, netlink.FAMILY_V4)
		if findRoute(routes, hostNet(GatewayV4), nil) == nil {
			t.Errorf("no scope-link route to %s: %+v", GatewayV4, routes)
		}
		if findRoute(routes, nil, GatewayV4.AsSlice()) == nil {
			t.Errorf("no default route via %s: %+v", GatewayV4, routes)
		}
		neighs, _ := netlink.NeighList(a.Index, netlink.FAMILY_V4)
		if n := findNeigh(neighs, GatewayV4); n == nil || n.State != netlink.NUD_PERMANENT || !bytes.Equal(n.HardwareAddr, att.HostMAC) {
			t.Errorf("pod neighbour %s: got %+v, want permanent -> %s", GatewayV4, n, att.HostMAC)
		}
		return nil
	})
	if err := check(node, cfg); err != nil {
		t.Errorf("CheckPod on a good pod: %v", err)
	}

	// Node -> pod over TCP proves routes and both static neighbours work.
	target := echoServer(t, getNS(t, cfg.NetNSPath), pod)
	if err := tcpRoundTrip(node, target); err != nil {
		t.Errorf("node -> pod: %v", err)
	}
}

func TestPodToPodDualStack(t *testing.T) {
	privileged.Require(t)
	node := newNode(t)
	do(t, node, func() error { return EnableForwarding(true) })
	a := podCfg(t, "10.244.1.10/32", "fd00:10::a/128")
	b := podCfg(t, "10.244.1.11/32", "fd00:10::b/128")
	a.MTU, b.MTU = 1400, 1400
	setup(t, node, a)
	setup(t, node, b)
	for _, cfg := range []PodConfig{a, b} {
		if err := check(node, cfg); err != nil {
			t.Errorf("CheckPod: %v", err)
		}
		inPod(t, cfg, func() error {
			l, _ := netlink.LinkByName("eth0")
			if l.Attrs().MTU != 1400 {
				t.Errorf("pod MTU = %d, want 1400", l.Attrs().MTU)
			}
			addrs, _ := netlink.AddrList(l, netlink.FAMILY_V6)
			for _, ad := range addrs {
				if ad.IP.IsGlobalUnicast() && (ad.Flags&unix.IFA_F_NODAD == 0 || ad.Flags&unix.IFA_F_TENTATIVE != 0) {
					t.Errorf("IPv6 address %s flags %#x: want NODAD and not tentative", ad.IPNet, ad.Flags)
				}
			}
			return nil
		})
	}
	nsB := getNS(t, b.NetNSPath)
	nsA := getNS(t, a.NetNSPath)
	for _, p := range b.Addrs {
		target := echoServer(t, nsB, p.Addr())
		if err := tcpRoundTrip(nsA, target); err != nil {
			t.Errorf("pod A -> pod B %s: %v", p.Addr(), err)
		}
		if err := tcpRoundTrip(node, target); err != nil {
			t.Errorf("node -> pod B %s: %v", p.Addr(), err)
		}
	}
}

func TestCheckPodReportsBreakage(t *testing.T) {
	privileged.Require(t)
	node := newNode(t)
	cases := []struct {
		name    string
		breakIt func(t *testing.T, cfg PodConfig, att *Attachment)
		want    string
	}{
		{"pod default route", func(t *testing.T, cfg PodConfig, att *Attachment) {
			inPod(t, cfg, func() error {
				return netlink.RouteDel(&netlink.Route{LinkIndex: att.PodIfIndex, Gw: GatewayV4.AsSlice()})
			})
		}, "default route via 169.254.1.1 missing on eth0 in "},
		{"pod gateway route", func(t *testing.T, cfg PodConfig, att *Attachment) {
			inPod(t, cfg, func() error {
				return netlink.RouteDel(&netlink.Route{LinkIndex: att.PodIfIndex, Dst: hostNet(GatewayV4), Scope: netlink.SCOPE_LINK})
			})
		}, "route to gateway 169.254.1.1 missing on eth0 in "},
		{"pod IPv6 default route", func(t *testing.T, cfg PodConfig, att *Attachment) {
			inPod(t, cfg, func() error {
				return netlink.RouteDel(&netlink.Route{LinkIndex: att.PodIfIndex, Gw: GatewayV6.AsSlice()})
			})
		}, "default route via fe80::1 missing on eth0 in "},
		{"pod address", func(t *testing.T, cfg PodConfig, att *Attachment) {
			inPod(t, cfg, func() error {
				return netlink.AddrDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: att.PodIfIndex}}, &netlink.Addr{IPNet: ipNet(cfg.Addrs[1])})
			})
		}, "address fd00:20::5/128 missing on eth0 in "},
		{"host veth down", func(t *testing.T, cfg PodConfig, att *Attachment) {
			do(t, node, func() error {
				return netlink.LinkSetDown(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: att.HostIfIndex}})
			})
		}, "host veth " + "%HOST% is down"},
		{"pod interface down", func(t *testing.T, cfg PodConfig, att *Attachment) {
			inPod(t, cfg, func() error {
				return netlink.LinkSetDown(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: att.PodIfIndex}})
			})
		}, "pod interface eth0 in %NS% is down"},
		{"pod neighbour", func(t *testing.T, cfg PodConfig, att *Attachment) {
			inPod(t, cfg, func() error {
				return netlink.NeighDel(permanentNeigh(att.PodIfIndex, GatewayV4, att.HostMAC))
			})
		}, "neighbour 169.254.1.1 -> %HOSTMAC% missing on eth0 in "},
		{"host route", func(t *testing.T, cfg PodConfig, att *Attachment) {
			do(t, node, func() error {
				return netlink.RouteDel(&netlink.Route{LinkIndex: att.HostIfIndex, Dst: ipNet(cfg.Addrs[0]), Scope: netlink.SCOPE_LINK})
			})
		}, "host route to 10.244.2.5 missing on %HOST%"},
		{"host neighbour", func(t *testing.T, cfg PodConfig, att *Attachment) {
			do(t, node, func() error {
				return netlink.NeighDel(permanentNeigh(att.HostIfIndex, cfg.Addrs[1].Addr(), att.PodMAC))
			})
		}, "host neighbour fd00:20::5 -> %PODMAC% missing on %HOST%"},
		{"pod lo down", func(t *testing.T, cfg PodConfig, att *Attachment) {
			inPod(t, cfg, func() error {
				return netlink.LinkSetDown(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: loopbackIndex}})
			})
		}, "lo in %NS% is down"},
		{"veth gone", func(t *testing.T, cfg PodConfig, att *Attachment) {
			do(t, node, func() error { return TeardownPod(cfg.HostIfName) })
		}, "host veth %HOST% missing"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := podCfg(t, "10.244.2.5/32", "fd00:20::5/128")
			att := setup(t, node, cfg)
			if err := check(node, cfg); err != nil {
				t.Fatalf("CheckPod before breaking: %v", err)
			}
			c.breakIt(t, cfg, att)
			want := strings.NewReplacer("%HOST%", cfg.HostIfName, "%NS%", cfg.NetNSPath,
				"%HOSTMAC%", att.HostMAC.String(), "%PODMAC%", att.PodMAC.String()).Replace(c.want)
			err := check(node, cfg)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("CheckPod = %v\nwant it to contain %q", err, want)
			}
			t.Logf("CheckPod: %v", err)
		})
	}
}

func TestCheckPodMissingPodInterface(t *testing.T) {
	privileged.Require(t)
	node := newNode(t)
	cfg := podCfg(t, "10.244.3.5/32")
	setup(t, node, cfg)
	cfg.IfName = "net1"
	err := check(node, cfg)
	want := "pod interface net1 missing in " + cfg.NetNSPath
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("CheckPod = %v, want %q", err, want)
	}
}

func TestTeardownPod(t *testing.T) {
	privileged.Require(t)
	node := newNode(t)
	cfg := podCfg(t, "10.244.4.5/32", "fd00:40::5/128")
	setup(t, node, cfg)
	do(t, node, func() error {
		if names, _ := ListHostIfaces(); len(names) != 1 || names[0] != cfg.HostIfName {
			t.Errorf("ListHostIfaces = %v, want [%s]", names, cfg.HostIfName)
		}
		for i := range 2 {
			if err := TeardownPod(cfg.HostIfName); err != nil {
				t.Fatalf("TeardownPod #%d: %v", i+1, err)
			}
		}
		if linkExists(cfg.HostIfName) {
			t.Errorf("host veth %s still exists", cfg.HostIfName)
		}
		for _, p := range cfg.Addrs {
			r, err := netlink.RouteGet(p.Addr().AsSlice())
			if err == nil && len(r) > 0 && r[0].LinkIndex != 0 {
				if l, _ := netlink.LinkByIndex(r[0].LinkIndex); l != nil && strings.HasPrefix(l.Attrs().Name, HostIfPrefix) {
					t.Errorf("route to %s still via %s", p.Addr(), l.Attrs().Name)
				}
			}
		}
		if names, _ := ListHostIfaces(); len(names) != 0 {
			t.Errorf("ListHostIfaces after teardown = %v", names)
		}
		return nil
	})
	inPod(t, cfg, func() error {
		if linkExists(cfg.IfName) {
			t.Errorf("pod %s still exists", cfg.IfName)
		}
		return nil
	})
	if err := check(node, cfg); err == nil {
		t.Error("CheckPod passed after teardown")
	}
}

func TestSetupPodIfNameTaken(t *testing.T) {
	privileged.Require(t)
	node := newNode(t)
	cfg := podCfg(t, "10.244.5.5/32")
	inPod(t, cfg, func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", TxQLen: -1}, PeerName: "other", PeerTxQLen: -1})
	})
	var err error
	do(t, node, func() error { _, err = SetupPod(cfg); return nil })
	want := "interface eth0 already exists in netns " + cfg.NetNSPath
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("SetupPod = %v, want %q", err, want)
	}
	do(t, node, func() error {
		if names, _ := ListHostIfaces(); len(names) != 0 {
			t.Errorf("host veths left behind: %v", names)
		}
		return nil
	})
}

func TestSetupPodFailureMidwayLeavesNothing(t *testing.T) {
	privileged.Require(t)
	node := newNode(t)
	cfg := podCfg(t, "10.244.6.5/32", "fd00:60::5/128")
	// With IPv6 disabled for new devices in the pod, the veth gets created and
	// the IPv4 part configured before the IPv6 address fails.
	inPod(t, cfg, func() error {
		return writeSysctl("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1")
	})
	var err error
	do(t, node, func() error { _, err = SetupPod(cfg); return nil })
	if err == nil || !strings.Contains(err.Error(), "add address fd00:60::5/128") {
		t.Fatalf("SetupPod = %v, want an error adding the IPv6 address", err)
	}
	t.Logf("SetupPod: %v", err)
	do(t, node, func() error {
		if names, _ := ListHostIfaces(); len(names) != 0 {
			t.Errorf("host veths left behind: %v", names)
		}
		r, _ := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: ipNet(cfg.Addrs[0])}, netlink.RT_FILTER_DST)
		if len(r) != 0 {
			t.Errorf("host route left behind: %+v", r)
		}
		return nil
	})
	inPod(t, cfg, func() error {
		if linkExists(cfg.IfName) {
			t.Errorf("pod interface %s left behind", cfg.IfName)
		}
		return nil
	})
}

func TestSetupPodReplacesStaleHostVeth(t *testing.T) {
	privileged.Require(t)
	node := newNode(t)
	cfg := podCfg(t, "10.244.7.5/32")
	first := setup(t, node, cfg)
	// As after a crashed ADD that the runtime retries: both names are taken.
	second := setup(t, node, cfg)
	if second.HostIfIndex == first.HostIfIndex || bytes.Equal(second.HostMAC, first.HostMAC) {
		t.Fatalf("second SetupPod reused the stale veth: %+v vs %+v", second, first)
	}
	if err := check(node, cfg); err != nil {
		t.Fatalf("CheckPod after replacing the stale veth: %v", err)
	}
	target := echoServer(t, getNS(t, cfg.NetNSPath), cfg.Addrs[0].Addr())
	if err := tcpRoundTrip(node, target); err != nil {
		t.Error(err)
	}
}

func TestListHostIfacesOnlyCoordinoVeths(t *testing.T) {
	privileged.Require(t)
	node := newNode(t)
	a := podCfg(t, "10.244.8.5/32")
	b := podCfg(t, "10.244.8.6/32")
	setup(t, node, a)
	setup(t, node, b)
	do(t, node, func() error {
		got, err := ListHostIfaces()
		if err != nil {
			return err
		}
		want := []string{a.HostIfName, b.HostIfName}
		if want[0] > want[1] {
			want[0], want[1] = want[1], want[0]
		}
		if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
			t.Errorf("ListHostIfaces = %v, want %v (uplink0/1 excluded)", got, want)
		}
		return nil
	})
}

func TestDefaultMTUWithoutDefaultRoute(t *testing.T) {
	privileged.Require(t)
	bare := newNS(t)
	do(t, bare, func() error {
		if got := DefaultMTU(); got != 1500 {
			t.Errorf("DefaultMTU without a default route = %d, want 1500", got)
		}
		return nil
	})
	node := newNode(t)
	do(t, node, func() error {
		if got := DefaultMTU(); got != uplinkMTU {
			t.Errorf("DefaultMTU = %d, want %d", got, uplinkMTU)
		}
		return nil
	})
}

func TestEnableForwarding(t *testing.T) {
	privileged.Require(t)
	node := newNS(t)
	do(t, node, func() error {
		if err := EnableForwarding(true); err != nil {
			return err
		}
		for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if v := readSysctl(t, f); v != "1" {
				t.Errorf("%s = %q after EnableForwarding", f, v)
			}
		}
		return nil
	})
}

// BenchmarkSetupTeardown measures one SetupPod plus one TeardownPod of an
// IPv4 pod with a fixed MTU (as the daemon passes it); the setup and teardown
// shares are reported as extra metrics.
func BenchmarkSetupTeardown(b *testing.B) {
	for _, bc := range []struct {
		name  string
		addrs []string
	}{
		{"ipv4", []string{"10.244.9.5/32"}},
		{"dualstack", []string{"10.244.9.5/32", "fd00:90::5/128"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			privileged.Require(b)
			node := newNode(b)
			cfg := podCfg(b, bc.addrs...)
			cfg.MTU = 1400
			var setupTime, teardownTime time.Duration
			err := node.Do(func(ns.NetNS) error {
				for b.Loop() {
					t0 := time.Now()
					if _, err := SetupPod(cfg); err != nil {
						return err
					}
					t1 := time.Now()
					if err := TeardownPod(cfg.HostIfName); err != nil {
						return err
					}
					setupTime += t1.Sub(t0)
					teardownTime += time.Since(t1)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(setupTime.Nanoseconds())/float64(b.N), "setup-ns/op")
			b.ReportMetric(float64(teardownTime.Nanoseconds())/float64(b.N), "teardown-ns/op")
		})
	}
}

// WhileConfiguring gets the host veth's ifindex and SetupPod waits for it;
// its failure fails SetupPod and leaves nothing behind, like any other step.
func TestSetupPodWhileConfiguring(t *testing.T) {
	privileged.Require(t)
	node := newNode(t)
	cfg := podCfg(t, "10.244.7.5/32")
	var got int
	var gotMACs []net.HardwareAddr
	cfg.WhileConfiguring = func(hostIfIndex int, hostMAC, podMAC net.HardwareAddr) error {
		time.Sleep(20 * time.Millisecond) // finishes after the netlink work: SetupPod must wait
		got, gotMACs = hostIfIndex, []net.HardwareAddr{hostMAC, podMAC}
		return nil
	}
	var att *Attachment
	var err error
	do(t, node, func() error { att, err = SetupPod(cfg); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if got == 0 || got != att.HostIfIndex {
		t.Fatalf("WhileConfiguring got ifindex %d, the host veth is %d", got, att.HostIfIndex)
	}
	if gotMACs[0].String() != att.HostMAC.String() || gotMACs[1].String() != att.PodMAC.String() {
		t.Fatalf("WhileConfiguring got MACs %v, the pair has %s and %s", gotMACs, att.HostMAC, att.PodMAC)
	}
	do(t, node, func() error { return TeardownPod(cfg.HostIfName) })

	cfg.WhileConfiguring = func(int, net.HardwareAddr, net.HardwareAddr) error { return errors.New("attach refused") }
	do(t, node, func() error { _, err = SetupPod(cfg); return nil })
	if err == nil || err.Error() != "attach refused" {
		t.Fatalf("SetupPod with a failing WhileConfiguring = %v", err)
	}
	do(t, node, func() error {
		if names, _ := ListHostIfaces(); len(names) != 0 {
			t.Errorf("host veths left behind: %v", names)
		}
		return nil
	})
}
