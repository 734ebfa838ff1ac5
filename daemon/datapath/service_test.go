package datapath

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/daemon/postdnat"
)

// Service tests: an nftables DNAT rule in the node netns stands in for
// kube-proxy (test/k8smode runs the real one): Service address svcIP
// port 8080 translates to pod b port 80 (TCP and UDP). The full matrix
// against kube-proxy is in test/k8smode; these pin the datapath's part.

var (
	svcCIDR  = netip.MustParsePrefix("10.96.0.0/16")
	svcIP    = netip.MustParseAddr("10.96.0.10")
	svcCIDR6 = netip.MustParsePrefix("fd00:96::/108")
	svcIP6   = netip.MustParseAddr("fd00:96::10")
)

// dnatToServer installs the DNAT rule; removed at cleanup.
func dnatToServer(t *testing.T) {
	t.Helper()
	nftDNAT(t, "ip", svcIP.String(), podIPs["b"].String(), 80)
}

// nftDNAT translates svc port 8080 (TCP, UDP) to backend:port in a table
// of family ("ip" or "ip6"), as kube-proxy's nftables mode does.
func nftDNAT(t testing.TB, family, svc, backend string, port int) {
	t.Helper()
	nftDNATFrom(t, family, svc, 8080, backend, port)
}

// nftDNATFrom translates svc:svcPort (TCP, UDP) to backend:port.
func nftDNATFrom(t testing.TB, family, svc string, svcPort int, backend string, port int) {
	t.Helper()
	table := fmt.Sprintf("cdotest%x", rand.Uint32())
	match := map[string]string{"ip": "ip", "ip6": "ip6"}[family]
	rules := fmt.Sprintf(`table %[1]s %[2]s {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		%[3]s daddr %[4]s tcp dport %[7]d dnat to %[5]s:%[6]d
		%[3]s daddr %[4]s udp dport %[7]d dnat to %[5]s:%[6]d
	}
}`, family, table, match, svc, backend, port, svcPort)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", family, table).Run() })
}

// expectService probes pod from → the Service on proto/8080.
func (c *cluster) expectService(allowed bool, from, proto string) {
	c.t.Helper()
	err := c.pods[from].Probe(proto, svcIP, 8080)
	if allowed && err != nil {
		c.t.Errorf("%s>service %s/8080: want allowed, got %v", from, proto, err)
	}
	if !allowed && err == nil {
		c.t.Errorf("%s>service %s/8080: want denied, but it passed", from, proto)
	}
}

// clientEgressTo isolates a's egress (app=client in default), allowing only
// peer on port 80 (the backend's port, not the Service's).
func clientEgressTo(peer string) string {
	return `
metadata: {name: client-egress, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress: [{to: [` + peer + `], ports: [{protocol: TCP, port: 80}, {protocol: UDP, port: 80}]}]`
}

// TestServiceDecidedOnBackend: egress policy is decided on the destination
// DNAT chose. Allowing the backend's pods lets the client reach the Service
// (the old datapath judged the Service address and dropped it); allowing
// the Service CIDR but not the backend denies it (the old one allowed it).
func TestServiceDecidedOnBackend(t *testing.T) {
	serviceStages(t, testServiceDecidedOnBackend)
}

func testServiceDecidedOnBackend(t *testing.T, cfg Config) {
	c := newClusterWith(t, cfg, false)
	c.requireStage(map[bool]ServiceStage{true: ServiceStageNetfilter, false: ServiceStageNftables}[cfg.Features.Has(kernel.NetfilterLink)])
	dnatToServer(t)
	c.expectService(true, "a", "tcp") // not isolated yet

	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}`))
	c.expectService(true, "a", "tcp")
	c.expectService(true, "a", "udp")
	c.expect(true, "a>b tcp/80")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flows := make(chan Flow, 64)
	go func() { _ = c.dp.ReadFlows(ctx, func(f Flow) { flows <- f }) }()
	c.policies(clientEgressTo(`{ipBlock: {cidr: 10.96.0.0/16}}`))
	c.expectService(false, "a", "tcp")
	c.expectService(false, "a", "udp")
	c.expectService(true, "c", "tcp") // c's namespace has no policy
	if n := reasonCount(t, c, "policy-denied"); n == 0 {
		t.Error("no egress drop counted as policy-denied")
	}
	// The drop is reported on a's endpoint with the backend it was decided on.
	timeout := time.After(2 * time.Second)
	for {
		select {
		case f := <-flows:
			if f.Reason == "policy-denied" && f.Direction == "egress" && f.IfIndex == uint32(c.eps["a"].HostIfIndex) &&
				f.Dst == podIPs["b"] && f.DstPort == 80 {
				return
			}
		case <-timeout:
			t.Fatal("no policy-denied flow event from a to the backend b:80")
		}
	}
}

// openServiceFlow builds the cluster with the Service, lets a reach b, and
// returns a working connection from a through the Service.
func openServiceFlow(t *testing.T, cfg Config) (*cluster, net.Conn) {
	t.Helper()
	c := newClusterWith(t, cfg, false)
	dnatToServer(t)
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}`))
	conn, err := c.pods["a"].Dial(svcIP, 8080)
	if err != nil {
		t.Fatalf("dial service: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := testnet.Echo(conn); err != nil {
		t.Fatalf("echo: %v", err)
	}
	return c, conn
}

// TestServiceFlowRevokedOnBackend: an open connection through a Service
// is cut when a policy change stops allowing its backend, and kept when
// the change still allows it.
func TestServiceFlowRevokedOnBackend(t *testing.T) {
	serviceStages(t, testServiceFlowRevokedOnBackend)
}

func testServiceFlowRevokedOnBackend(t *testing.T, cfg Config) {
	c, conn := openServiceFlow(t, cfg)
	// Still allowed (another rule now): the connection keeps working.
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}, {ipBlock: {cidr: 203.0.113.0/24}}`))
	if err := testnet.Echo(conn); err != nil {
		t.Fatalf("echo after a change that still allows the backend: %v", err)
	}
	c.policies(clientEgressTo(`{ipBlock: {cidr: 10.96.0.0/16}}`))
	if err := testnet.Echo(conn); err == nil {
		t.Fatal("connection to a backend no longer allowed still works")
	}
	if n := reasonCount(t, c, "policy-revoked"); n == 0 {
		t.Error("no packet counted as policy-revoked")
	}
}

// TestServiceFailsClosedWithoutHook: without the post-DNAT hook (as on a
// kernel before 6.4), an egress-isolated pod's Service traffic is dropped
// even where its policy allows the backend, and counted with its reason.
func TestServiceFailsClosedWithoutHook(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, ServiceCIDRs: []netip.Prefix{svcCIDR}, NoServiceHook: true}, false)
	if c.dp.ServiceHookError() == nil {
		t.Fatal("hook reported attached although disabled")
	}
	dnatToServer(t)
	c.expectService(true, "a", "tcp") // not isolated: nothing to decide
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}, {ipBlock: {cidr: 10.96.0.0/16}}`))
	c.expectService(false, "a", "tcp")
	c.expect(true, "a>b tcp/80")
	if n := reasonCount(t, c, "service-unenforceable"); n == 0 {
		t.Error("no drop counted as service-unenforceable")
	}
}

// TestServiceIPv6DecidedOnBackend: the same decision for IPv6 (the
// program's second netfilter link).
func TestServiceIPv6DecidedOnBackend(t *testing.T) {
	serviceStages(t, testServiceIPv6DecidedOnBackend)
}

func testServiceIPv6DecidedOnBackend(t *testing.T, cfg Config) {
	svc6 := svcIP6
	cfg.ServiceCIDRs = append(cfg.ServiceCIDRs, svcCIDR6)
	c := newClusterWith(t, cfg, true)
	// The test pods serve IPv4 only: b gets an IPv6 echo server on 82.
	b6 := podIPs6["b"]
	c.pods["b"].ServeTCP(t, "tcp6", netip.AddrPortFrom(b6, 82).String())
	nftDNAT(t, "ip6", svc6.String(), "["+b6.String()+"]", 82)
	dial := func() error {
		return c.pods["a"].Do(func() error {
			conn, err := net.DialTimeout("tcp6", netip.AddrPortFrom(svc6, 8080).String(), testnet.Timeout)
			if err != nil {
				return err
			}
			defer conn.Close()
			return testnet.Echo(conn)
		})
	}
	allow := func(peer string) string {
		return `
metadata: {name: client-egress, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress: [{to: [` + peer + `], ports: [{protocol: TCP, port: 82}, {protocol: TCP, port: 8080}]}]`
	}
	c.policies(allow(`{podSelector: {matchLabels: {app: server}}}`))
	// A fresh IPv6 path may lose its first SYN to neighbour resolution.
	err := dial()
	for i := 0; err != nil && i < 2; i++ {
		err = dial()
	}
	if err != nil {
		t.Errorf("a>[%v]:8080 with the backend allowed: %v", svc6, err)
	}
	c.policies(allow(`{ipBlock: {cidr: "fd00:96::/108"}}`))
	if err := dial(); err == nil {
		t.Errorf("a>[%v]:8080 with only the Service CIDR allowed: passed, want denied", svc6)
	}
}

// TestServiceHookSurvivesRestart: the post-DNAT links are pinned, so
// while no daemon runs a denied Service flow stays denied (an unpinned hook
// would vanish with the daemon and the tc program's deferral would let it
// through), and a new daemon replaces them without leaving extra hooks.
func TestServiceHookSurvivesRestart(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, ServiceCIDRs: []netip.Prefix{svcCIDR}}, false)
	dnatToServer(t)
	c.policies(clientEgressTo(`{ipBlock: {cidr: 10.96.0.0/16}}`))
	c.expectService(false, "a", "tcp")
	if err := c.dp.Close(); err != nil {
		t.Fatal(err)
	}
	c.expectService(false, "a", "tcp")
	c.open()
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}`))
	c.expectService(true, "a", "tcp")
	pins, err := filepath.Glob(filepath.Join(c.cfg.BPFDir, "links", "service-*"))
	if err != nil || len(pins) != 2 {
		t.Errorf("service link pins after restart: %v (%v), want service-ipv4 and service-ipv6", pins, err)
	}
}

// TestServiceCIDRRemovedFlowsJudgedAnew: a restart without a Service CIDR
// forgets that CIDR's flows, which the post-DNAT hook no longer looks at;
// kept, a flow sent back to pending by a policy change would pass
// undecided for ever.
func TestServiceCIDRRemovedFlowsJudgedAnew(t *testing.T) {
	serviceStages(t, testServiceCIDRRemovedFlowsJudgedAnew)
}

func testServiceCIDRRemovedFlowsJudgedAnew(t *testing.T, cfg Config) {
	c, conn := openServiceFlow(t, cfg)
	if err := c.dp.Close(); err != nil {
		t.Fatal(err)
	}
	c.cfg.ServiceCIDRs = nil
	c.open()
	// Now judged on the Service address, which no rule allows.
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}, {ipBlock: {cidr: 203.0.113.0/24}}`))
	if err := testnet.Echo(conn); err == nil {
		t.Fatal("flow to a former Service CIDR still passes after a policy change")
	}
}

// TestServiceDecidedForBridgedPod: a pod whose host veth is a bridge port
// (chained after a bridge CNI) enters PREROUTING from the bridge, not its
// veth; its deferred flows are still decided (found by their tuple), not
// waved through undecided.
func TestServiceDecidedForBridgedPod(t *testing.T) {
	serviceStages(t, testServiceDecidedForBridgedPod)
}

func testServiceDecidedForBridgedPod(t *testing.T, cfg Config) {
	c := newClusterWith(t, cfg, false)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("cdb%x", rand.Uint32()&0xffffff)}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(br) })
	port, err := netlink.LinkByName(c.pods["a"].HostIfName)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetMaster(port, br); err != nil {
		t.Fatal(err)
	}
	dnatToServer(t)
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}`))
	c.expectService(true, "a", "tcp")
	c.policies(clientEgressTo(`{ipBlock: {cidr: 10.96.0.0/16}}`))
	c.expectService(false, "a", "tcp")
	c.expectService(false, "a", "udp")
}

// nfHookState is the kernel's struct nf_hook_state as BPF_PROG_TEST_RUN
// takes it for a netfilter program: hook and family. The run leaves the
// input device unset, which the program reads as interface index 0.
type nfHookState struct {
	Hook, PF uint8
	_        [46]byte
}

const (
	nfDrop         = 0
	nfAccept       = 1
	noInputIfindex = 0
	nfprotoIPv4    = 2
	nfprotoIPv6    = 10
)

// runPostDNAT runs the post-DNAT program on frame at PREROUTING of family
// (nfprotoIPv4 or nfprotoIPv6) and returns its verdict.
func runPostDNAT(t *testing.T, objs *bpf.CoordinoSvcPrograms, frame []byte, family uint8) uint32 {
	t.Helper()
	ret, err := objs.CdoSvc.Run(&ebpf.RunOptions{Data: frame, Context: nfHookState{Hook: 0 /* PRE_ROUTING */, PF: family}})
	if err != nil {
		t.Fatalf("run post-DNAT program: %v", err)
	}
	return ret
}

// TestServiceDecidedWhenDeferralLost: the maps that carry a deferred flow
// from the tc program to the post-DNAT program are LRU maps a pod can fill
// (with frames that never reach PREROUTING), so either entry may be gone
// when the packet gets there. The flow must then be decided, not passed:
// the program used to accept a packet whose pending entry or conntrack
// entry was missing, letting an egress-isolated pod reach a backend its
// policy denies. Runs the post-DNAT program with BPF_PROG_TEST_RUN; a's
// endpoint under index 0 (the run's missing input device) makes a's veth
// the input device.
func TestServiceDecidedWhenDeferralLost(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, ServiceCIDRs: []netip.Prefix{svcCIDR}}, false)
	objs, err := c.dp.svc.loadServiceProgram()
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	eps := c.dp.objs.CdoEndpoints
	aIf := uint32(c.eps["a"].HostIfIndex)
	t.Cleanup(func() { _ = eps.Delete(uint32(noInputIfindex)) })
	// The input device is a's veth: a's endpoint under index 0.
	asInputDevice := func() {
		t.Helper()
		var info bpf.CoordinoEndpointInfo
		if err := eps.Lookup(aIf, &info); err != nil {
			t.Fatal(err)
		}
		if err := eps.Put(uint32(noInputIfindex), &info); err != nil {
			t.Fatal(err)
		}
	}
	sport := uint16(40000)
	postDNAT := func(dst netip.Addr, port uint16) uint32 {
		t.Helper()
		return runPostDNAT(t, objs, frame(podIPs["a"], dst, protoTCP, tcp(sport, port, tcpSYN)), nfprotoIPv4)
	}
	// deferSYN has the tc program defer a's SYN to the Service: a pending
	// entry and a pending conntrack entry.
	deferSYN := func() {
		t.Helper()
		sport++
		if !c.fromPod("a", frame(podIPs["a"], svcIP, protoTCP, tcp(sport, 8080, tcpSYN))) {
			t.Fatal("tc program dropped the SYN it should defer")
		}
	}

	// a may reach only the backend pods: the Service address as such
	// (no DNAT in a test run) is denied.
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}`))
	deferSYN()
	if got := postDNAT(svcIP, 8080); got != nfDrop {
		t.Errorf("both entries present: verdict %d, want drop", got)
	}
	deferSYN()
	clearMap(t, c.dp.objs.CdoConntrack)
	if got := postDNAT(svcIP, 8080); got != nfDrop {
		t.Errorf("conntrack entry lost: verdict %d, want drop", got)
	}
	asInputDevice()
	deferSYN()
	clearMap(t, c.dp.objs.CdoSvcPending)
	if got := postDNAT(svcIP, 8080); got != nfDrop {
		t.Errorf("pending entry lost: verdict %d, want drop", got)
	}
	sport++
	if got := postDNAT(svcIP, 8080); got != nfDrop {
		t.Errorf("both entries lost: verdict %d, want drop", got)
	}
	if got := postDNAT(podIPs["b"], 8080); got != nfAccept {
		t.Errorf("not to a Service: verdict %d, want accept", got)
	}

	// A bridge as the input device names no endpoint: this CPU's slot
	// still names a, as when the tc program and the hook run in one
	// softirq. Both runs on one CPU.
	if err := eps.Delete(uint32(noInputIfindex)); err != nil {
		t.Fatal(err)
	}
	onOneCPU(t, func() {
		deferSYN()
		clearMap(t, c.dp.objs.CdoSvcPending)
		if got := postDNAT(svcIP, 8080); got != nfDrop {
			t.Errorf("bridged, pending entry lost: verdict %d, want drop", got)
		}
	})

	// Where policy allows the destination (the Service CIDR on port 80
	// here), a lost entry costs nothing.
	c.policies(clientEgressTo(`{ipBlock: {cidr: 10.96.0.0/16}}`))
	asInputDevice()
	sport++
	if got := postDNAT(svcIP, 80); got != nfAccept {
		t.Errorf("allowed, both entries lost: verdict %d, want accept", got)
	}
}

// onOneCPU runs fn on one OS thread bound to one CPU, so that successive
// BPF_PROG_TEST_RUNs share per-CPU map slots.
func onOneCPU(t *testing.T, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var was, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		t.Fatal(err)
	}
	cpu := 0
	for !was.IsSet(cpu) {
		cpu++
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		t.Fatal(err)
	}
	defer unix.SchedSetaffinity(0, &was)
	fn()
}

// TestServiceDeniedFirstFragmentTakesTheRest: where nothing reassembles
// fragments before the post-DNAT hook (no conntrack in the node's netns),
// the hook decides a deferred first fragment, and the tc program had
// already remembered its ports for the later ones: a denial must take those
// with it, or the later fragments pass (the hook cannot judge them).
func TestServiceDeniedFirstFragmentTakesTheRest(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC, ServiceCIDRs: []netip.Prefix{svcCIDR}}, false)
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}`))
	objs, err := c.dp.svc.loadServiceProgram()
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	first := eth(etherIPv4, ipv4(podIPs["a"], svcIP, protoUDP, ip4opts{id: 7, frag: 0x2000}, udp(40000, 8080, make([]byte, 16))))
	later := eth(etherIPv4, ipv4(podIPs["a"], svcIP, protoUDP, ip4opts{id: 7, frag: 3}, make([]byte, 16)))
	onOneCPU(t, func() {
		if !c.fromPod("a", first) {
			t.Fatal("tc program dropped the first fragment it should defer")
		}
		if ret := runPostDNAT(t, objs, first, nfprotoIPv4); ret != nfDrop {
			t.Fatalf("first fragment to a denied destination: verdict %d, want drop", ret)
		}
		if c.fromPod("a", later) {
			t.Error("a later fragment of the denied datagram passed the tc program")
		}
	})
}

// serviceStages runs fn once per post-DNAT stage: the BPF netfilter
// program, and the nftables stage that kernels without BPF netfilter links
// (before 6.4) take, here chosen by hiding the links from the feature
// table. A stage the kernel cannot run is skipped, naming the feature.
func serviceStages(t *testing.T, fn func(t *testing.T, cfg Config)) {
	all := kernel.Probe()
	for _, s := range []struct {
		stage    ServiceStage
		features *kernel.Features
		needs    []kernel.Name
	}{
		{ServiceStageNetfilter, all, []kernel.Name{kernel.NetfilterLink, kernel.DynptrFromSkb}},
		{ServiceStageNftables, all.Without(kernel.NetfilterLink), []kernel.Name{kernel.XTBPFMatch}},
	} {
		t.Run(string(s.stage), func(t *testing.T) {
			for _, n := range s.needs {
				if !s.features.Has(n) {
					t.Skipf("the kernel has no %s (docs/kernels.md)", n)
				}
			}
			fn(t, Config{AttachMode: AttachTC, ServiceCIDRs: []netip.Prefix{svcCIDR}, Features: s.features})
		})
	}
}

// requireStage fails the test unless c decides Service traffic with stage.
func (c *cluster) requireStage(stage ServiceStage) {
	c.t.Helper()
	if err := c.dp.ServiceHookError(); err != nil || c.dp.ServiceStage() != stage {
		c.t.Fatalf("post-DNAT stage %q (%v), want %q", c.dp.ServiceStage(), err, stage)
	}
}

// TestServiceStageFallsBack: on a kernel without BPF netfilter links the
// daemon takes the nftables stage, and without that too it fails closed,
// saying why; what the kernel has decides, not its version.
func TestServiceStageFallsBack(t *testing.T) {
	all := kernel.Probe()
	if !all.Has(kernel.XTBPFMatch) {
		t.Skipf("the kernel has no %s (docs/kernels.md)", kernel.XTBPFMatch)
	}
	c := newClusterWith(t, Config{AttachMode: AttachTC, ServiceCIDRs: []netip.Prefix{svcCIDR},
		Features: all.Without(kernel.NetfilterLink)}, false)
	c.requireStage(ServiceStageNftables)
	if ok, err := postdnat.Installed(); !ok || err != nil {
		t.Fatalf("nftables stage not installed: %v %v", ok, err)
	}
	if err := c.dp.Close(); err != nil {
		t.Fatal(err)
	}
	c.cfg.Features = all.Without(kernel.NetfilterLink, kernel.XTBPFMatch)
	c.open()
	if c.dp.ServiceStage() != ServiceStageNone || c.dp.ServiceHookError() == nil ||
		!strings.Contains(c.dp.ServiceHookError().Error(), "xtables BPF match") {
		t.Fatalf("stage %q, error %v: want none, naming the missing match", c.dp.ServiceStage(), c.dp.ServiceHookError())
	}
	if ok, _ := postdnat.Installed(); ok {
		t.Error("the nftables stage outlived a daemon that no longer uses it")
	}
	dnatToServer(t)
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}`))
	c.expectService(false, "a", "tcp")
}

// TestServiceIPBlockExceptAfterDNAT: an ipBlock's except holds through
// DNAT: the pods' range minus the backend denies the Service, minus another
// address allows it; the Service CIDR itself allows nothing.
func TestServiceIPBlockExceptAfterDNAT(t *testing.T) {
	serviceStages(t, testServiceIPBlockExceptAfterDNAT)
}

func testServiceIPBlockExceptAfterDNAT(t *testing.T, cfg Config) {
	c := newClusterWith(t, cfg, false)
	dnatToServer(t)
	c.policies(clientEgressTo(`{ipBlock: {cidr: 198.51.100.0/24, except: [198.51.100.11/32]}}`))
	c.expectService(false, "a", "tcp")
	c.expectService(false, "a", "udp")
	c.expect(false, "a>b tcp/80")
	c.policies(clientEgressTo(`{ipBlock: {cidr: 198.51.100.0/24, except: [198.51.100.12/32]}}`))
	c.expectService(true, "a", "tcp")
	c.expectService(true, "a", "udp")
	c.policies(clientEgressTo(`{ipBlock: {cidr: 10.96.0.0/16, except: [10.96.0.10/32]}}`))
	c.expectService(false, "a", "tcp")
}

// TestServiceCIDRsSetLive: Service ranges learnt after Open (the API's
// ServiceCIDR objects) take effect at once: before, the Service address is
// judged (denied: only the backend is allowed); after, the backend is; and
// a range withdrawn is judged on the Service address again.
func TestServiceCIDRsSetLive(t *testing.T) {
	c := newClusterWith(t, Config{AttachMode: AttachTC}, false)
	dnatToServer(t)
	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}`))
	c.expectService(false, "a", "tcp")
	if err := c.dp.SetServiceCIDRs([]netip.Prefix{svcCIDR}); err != nil {
		t.Fatal(err)
	}
	if !c.dp.ServiceAddress(svcIP) || c.dp.ServiceHookError() != nil {
		t.Fatalf("after SetServiceCIDRs: %s a Service address %v, hook error %v", svcIP, c.dp.ServiceAddress(svcIP), c.dp.ServiceHookError())
	}
	c.expectService(true, "a", "tcp")
	c.expectService(true, "a", "udp")
	if err := c.dp.SetServiceCIDRs(nil); err != nil {
		t.Fatal(err)
	}
	c.expectService(false, "a", "tcp")
}

// TestNodePortDecidedOnBackend: a node address on a NodePort port is
// decided on the backend, as a ClusterIP: allowing the backend's pods lets
// the client reach the node port (the old datapath judged the node address
// and dropped it), allowing the node address but not the backend denies it
// (the old one allowed it). Read as an attacker: the node address on any
// other port is still judged on the address, and so is a listed port that
// nothing translates, so deferring never turns into an allow for a port
// that is not a Service's. A node port withdrawn is judged on the address
// again.
func TestNodePortDecidedOnBackend(t *testing.T) {
	serviceStages(t, testNodePortDecidedOnBackend)
}

func testNodePortDecidedOnBackend(t *testing.T, cfg Config) {
	c := newClusterWith(t, cfg, false)
	c.requireStage(map[bool]ServiceStage{true: ServiceStageNetfilter, false: ServiceStageNftables}[cfg.Features.Has(kernel.NetfilterLink)])
	node := testnet.NodeIP
	const (
		nodePort   = 30080 // translated to b:80
		hostPort   = 30081 // a listener on the node, no Service
		staleNPort = 30082 // a listed node port nothing translates; the node listens
	)
	nftDNATFrom(t, "ip", node.String(), nodePort, podIPs["b"].String(), 80)
	testnet.ServeNodeTCP(t, "tcp4", netip.AddrPortFrom(node, hostPort).String())
	testnet.ServeNodeTCP(t, "tcp4", netip.AddrPortFrom(node, staleNPort).String())
	if err := c.dp.SetNodePorts([]NodePort{
		{Addr: node, Proto: unix.IPPROTO_TCP, Port: nodePort}, {Addr: node, Proto: unix.IPPROTO_UDP, Port: nodePort},
		{Addr: node, Proto: unix.IPPROTO_TCP, Port: staleNPort},
	}); err != nil {
		t.Fatal(err)
	}
	probe := func(allowed bool, proto string, port int) {
		t.Helper()
		err := c.pods["a"].Probe(proto, node, port)
		if allowed && err != nil {
			t.Errorf("a>node %s/%d: want allowed, got %v", proto, port, err)
		}
		if !allowed && err == nil {
			t.Errorf("a>node %s/%d: want denied, but it passed", proto, port)
		}
	}
	probe(true, "tcp", nodePort) // not isolated yet

	c.policies(clientEgressTo(`{podSelector: {matchLabels: {app: server}}}`))
	probe(true, "tcp", nodePort)
	probe(true, "udp", nodePort)
	probe(false, "tcp", hostPort)
	probe(false, "tcp", staleNPort)
	if !c.dp.ServiceTarget(node, unix.IPPROTO_TCP, nodePort) || c.dp.ServiceTarget(node, unix.IPPROTO_TCP, hostPort) {
		t.Error("ServiceTarget: want the node port deferred and the host port not")
	}

	c.policies(`
metadata: {name: client-egress, namespace: default}
spec:
  podSelector: {matchLabels: {app: client}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 192.0.2.1/32}}]}]`)
	probe(false, "tcp", nodePort)
	probe(false, "udp", nodePort)
	probe(true, "tcp", hostPort)
	probe(true, "tcp", staleNPort) // untranslated: decided on the node address

	if err := c.dp.UpdateNodePorts(nil, []NodePort{{Addr: node, Proto: unix.IPPROTO_TCP, Port: nodePort}}); err != nil {
		t.Fatal(err)
	}
	probe(true, "tcp", nodePort)  // judged on the node address again
	probe(false, "udp", nodePort) // still deferred
}
