package multinode

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/bgp"
	"github.com/coordino/coordino/test/harness"
)

// The fabric: two racks on different subnets behind one FRR router (the
// underlay namespace, AS 65000); node0 and node1 in rack 1, node2 in
// rack 2, each its own AS, peering with the router over IPv4 for IPv4 and
// over IPv6 for IPv6.
var (
	rackNets = [2][2]netip.Prefix{
		{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:1::/64")},
		{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8:2::/64")},
	}
	routerASN = 65000
	// hijack is what the router announces itself: half of node0's IPv4
	// block. node0 must not install it; the others do (they cannot tell).
	hijack = netip.MustParsePrefix("10.10.0.128/25")
	// fabricHold is the sessions' hold time; fabricRestart the nodes'
	// graceful-restart time: a node that vanishes keeps its routes in the
	// router for both (FRR treats a hold-timer expiry as a restart).
	fabricHold    = 9 * time.Second
	fabricRestart = 30 * time.Second
	// fabricPassword protects node1's IPv4 session; no log may show it.
	fabricPassword = "md5-fabric-s3cret"
	// unansweredPeer is a peer of node1 that does not exist.
	unansweredPeer = netip.MustParseAddr("198.51.100.200")
)

// announceLabel=yes selects the Services the Kubernetes-mode fabric's
// nodes announce (their --bgp-config's serviceSelector).
const announceLabel = "bgp-announce"

var bgpMode = mode{name: "bgp", routing: "bgp", encryption: "none"}

// rackOf puts node0 and node1 in rack 1, the others in rack 2.
func rackOf(i int) int { return min(i/2, 1) }

// rackAddr is host h of rack r's subnet in a family (h 254 is the router).
func rackAddr(r, h int, v6 bool) netip.Addr {
	if v6 {
		a := rackNets[r][1].Addr().As16()
		a[15] = byte(h)
		return netip.AddrFrom16(a)
	}
	a := rackNets[r][0].Addr().As4()
	a[3] = byte(h)
	return netip.AddrFrom4(a)
}

func (n *node) fabricAddr(v6 bool) netip.Addr { return rackAddr(rackOf(n.index), n.index+1, v6) }

// fabric is a cluster whose underlay namespace is the FRR router.
type fabric struct {
	*cluster
	frrDir  string
	bridges [2]string
	extra   int
}

// TestFabricBGP: make test-fabric (docs/cluster.md).
func TestFabricBGP(t *testing.T) {
	f := newFabric(t, 3)
	t.Run("routes-in-router-and-kernels", f.checkRoutes)
	t.Run("pods-across-racks", func(t *testing.T) { checkReachability(t, f.cluster) })
	t.Run("own-block-from-peer-not-installed", f.checkHijackRefused)
	t.Run("status-md5-unanswered-peer", f.checkStatus)
	t.Run("daemon-sigkill-graceful-restart", f.checkGracefulRestart)
	t.Run("node-lost-withdrawn-within-hold-time", f.checkNodeLost)
	t.Run("wrong-asn-refused-nothing-installed", f.checkWrongASN)
}

// requireFRR skips (fails under CI=true) without FRR: hack/fabric-deps.sh
// installs it.
func requireFRR(t *testing.T) {
	for _, p := range []string{"/usr/lib/frr/zebra", "/usr/lib/frr/bgpd", "/usr/bin/vtysh"} {
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("FRR missing (%s): run hack/fabric-deps.sh", p)
			}
			t.Skipf("FRR missing (%s): run hack/fabric-deps.sh (Debian package frr)", p)
		}
	}
}

func newFabric(t *testing.T, count int) *fabric { return newFabricWith(t, bgpMode, count, 0, false) }

// newFabricWith has the router announce extra /28s of its own (from
// 10.200.0.0 on), as a fabric with that many other blocks would; with
// kube, the nodes run in Kubernetes mode against an API server (their
// speakers still configured by --bgp-config).
func newFabricWith(t *testing.T, m mode, count, extra int, kube bool) *fabric {
	requireFRR(t)
	c := newUnderlay(t, m)
	if kube {
		c.kube = startKube(t)
	}
	f := &fabric{cluster: c, extra: extra, bridges: [2]string{c.bridge, "br-" + harness.RandomSuffix(6)}}
	if err := c.underlay.Do(func(ns.NetNS) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: f.bridges[1], MTU: 1500}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		for r, name := range f.bridges {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			for _, v6 := range []bool{false, true} {
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(rackAddr(r, 254, v6), rackNets[r][b2i(v6)].Bits())), Flags: unix.IFA_F_NODAD}); err != nil {
					return err
				}
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		for _, p := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("router namespace: %v", err)
	}
	for i := 0; i < count; i++ {
		f.addNode()
	}
	if m.encryption == "wireguard" {
		c.writePeers(c.nodes)
	}
	f.startFRR()
	for _, n := range c.nodes {
		c.startDaemon(n)
	}
	if m.encryption == "wireguard" {
		// Keys exist once each daemon ran: distribute them now, as an
		// operator would.
		c.writePeers(c.nodes)
		c.waitTunnels()
	}
	if c.kube == nil {
		addServingPods(t, c)
		return f
	}
	for _, n := range c.nodes {
		c.addKubePod(n, nil)
	}
	return f
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// addNode is cluster.addNode on a rack: its own AS, a --bgp-config naming
// the router, the rack's addresses and a default route via the router.
func (f *fabric) addNode() *node {
	t, c := f.t, f.cluster
	i := len(c.nodes)
	n := &node{index: i}
	name := fmt.Sprintf("node%d", i)
	dir := filepath.Join(c.base, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	r := rackOf(i)
	cfg := fmt.Sprintf("localASN: %d\nrestartTimeSeconds: %d\npeers:\n- {address: %q, asn: %d, holdTimeSeconds: %d, families: [IPv4]}\n- {address: %q, asn: %d, holdTimeSeconds: %d, families: [IPv6]}\n",
		64601+i, int(fabricRestart/time.Second), rackAddr(r, 254, false), routerASN, int(fabricHold/time.Second), rackAddr(r, 254, true), routerASN, int(fabricHold/time.Second))
	if i == 1 {
		// node1: TCP MD5 on its IPv4 session, and a peer nobody answers for.
		pw := filepath.Join(dir, "bgp.password")
		if err := os.WriteFile(pw, []byte(fabricPassword+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg = strings.Replace(cfg, "families: [IPv4]}", fmt.Sprintf("families: [IPv4], passwordFile: %q}", pw), 1)
		cfg += fmt.Sprintf("- {address: %q, asn: %d, holdTimeSeconds: 9}\n", unansweredPeer, routerASN)
	}
	if c.kube != nil {
		cfg += fmt.Sprintf("serviceSelector: {matchLabels: {%s: %q}}\n", announceLabel, "yes")
	}
	if err := os.WriteFile(filepath.Join(dir, "bgp.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--routing", "bgp", "--bgp-config", filepath.Join(dir, "bgp.yaml")}
	if c.mode.encryption == "wireguard" {
		n.peersFile = filepath.Join(dir, "peers.yaml")
		n.wgDevice = "cwg" + harness.RandomSuffix(8)
		args = append(args, "--encryption", "wireguard", "--wireguard-device", n.wgDevice,
			"--wireguard-device-kind", c.mode.wgKind, "--peers-file", n.peersFile)
	}
	var err error
	n.Node, err = harness.NewNode(dir, name, harness.NodeOptions{
		NodeIP:    rackAddr(r, i+1, false).String(),
		PodCIDRs:  []string{n.blocks()[0].String(), n.blocks()[1].String()},
		ExtraArgs: args,
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.kube != nil {
		c.kube.join(t, n)
	}
	c.nodes = append(c.nodes, n)
	port := fmt.Sprintf("p%d-%s", i, harness.RandomSuffix(6))
	uFd := int(c.underlay.Fd())
	if err := n.NS.Do(func(ns.NetNS) error {
		if old, err := netlink.LinkByName("uplink0"); err == nil {
			if err := netlink.LinkDel(old); err != nil {
				return err
			}
		}
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0", MTU: 1500}, PeerName: port, PeerNamespace: netlink.NsFd(uFd)}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		for _, v6 := range []bool{false, true} {
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(n.fabricAddr(v6), rackNets[r][b2i(v6)].Bits())), Flags: unix.IFA_F_NODAD}); err != nil {
				return err
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		for _, v6 := range []bool{false, true} {
			dst := netip.MustParsePrefix("0.0.0.0/0")
			if v6 {
				dst = netip.MustParsePrefix("::/0")
			}
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(dst), Gw: rackAddr(r, 254, v6).AsSlice()}); err != nil {
				return fmt.Errorf("default route: %w", err)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("%s uplink: %v", name, err)
	}
	if err := c.bridgePort(port, f.bridges[r]); err != nil {
		t.Fatalf("%s rack port: %v", name, err)
	}
	return n
}

// startFRR runs zebra and bgpd in the router namespace with their config,
// sockets and pid files under the test's dir (no system service).
func (f *fabric) startFRR() {
	t := f.t
	// FRR runs as its own user (root is not in the vty group): its
	// directory is outside the test's root-only TempDir and belongs to it.
	u, err := user.Lookup("frr")
	if err != nil {
		t.Fatalf("FRR's user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if f.frrDir, err = os.MkdirTemp("", "coordino-frr-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(f.frrDir) })
	if err := os.Chown(f.frrDir, uid, gid); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "frr defaults datacenter\nhostname tor\nlog file %s/bgpd.log\n!\nrouter bgp %d\n bgp router-id %s\n no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n no bgp network import-check\n bgp graceful-restart\n timers bgp %d %d\n",
		f.frrDir, routerASN, rackAddr(0, 254, false), int(fabricHold/time.Second)/3, int(fabricHold/time.Second))
	for _, n := range f.nodes {
		for _, v6 := range []bool{false, true} {
			fmt.Fprintf(&b, " neighbor %s remote-as %d\n", n.fabricAddr(v6), 64601+n.index)
		}
		if n.index == 1 {
			fmt.Fprintf(&b, " neighbor %s password %s\n", n.fabricAddr(false), fabricPassword)
		}
	}
	for _, v6 := range []bool{false, true} {
		fmt.Fprintf(&b, " address-family ipv%d unicast\n", 4+2*b2i(v6))
		if !v6 {
			fmt.Fprintf(&b, "  network %s\n", hijack)
			for _, p := range extraPrefixes(f.extra) {
				fmt.Fprintf(&b, "  network %s\n", p)
			}
		}
		for _, n := range f.nodes {
			fmt.Fprintf(&b, "  neighbor %s activate\n", n.fabricAddr(v6))
		}
		b.WriteString(" exit-address-family\n")
	}
	b.WriteString("!\n")
	if err := os.WriteFile(filepath.Join(f.frrDir, "bgpd.conf"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.frrDir, "zebra.conf"), []byte("hostname tor\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	zsock := filepath.Join(f.frrDir, "zserv.api")
	for _, d := range []string{"zebra", "bgpd"} {
		args := []string{"--net=" + f.underlay.Path(), "/usr/lib/frr/" + d, "-u", "frr", "-g", "frr",
			"-f", filepath.Join(f.frrDir, d+".conf"), "-i", filepath.Join(f.frrDir, d+".pid"),
			"-z", zsock, "--vty_socket", f.frrDir, "-A", "127.0.0.1", "-P", "0"}
		cmd := exec.Command("nsenter", args...)
		logf, err := os.Create(filepath.Join(f.frrDir, d+".out"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", d, err)
		}
		proc := cmd.Process
		t.Cleanup(func() {
			_ = proc.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _, _ = proc.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				_ = proc.Kill()
				<-done
			}
			logf.Close()
			if t.Failed() {
				data, _ := os.ReadFile(filepath.Join(f.frrDir, d+".out"))
				t.Logf("%s output:\n%s", d, data)
			}
		})
		if d == "zebra" {
			if err := eventually(10*time.Second, func() error { _, err := os.Stat(zsock); return err }); err != nil {
				t.Fatalf("zebra did not open %s: %v", zsock, err)
			}
		}
	}
	if err := eventually(10*time.Second, func() error { _, err := f.vtysh("show bgp summary json"); return err }); err != nil {
		t.Fatalf("bgpd not answering: %v", err)
	}
}

// vtysh runs one command against the test's FRR.
func (f *fabric) vtysh(command string) ([]byte, error) {
	out, err := exec.Command("vtysh", "--vty_socket", f.frrDir, "-c", command).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("vtysh -c %q: %v: %s", command, err, out)
	}
	return out, nil
}

// routerRoute is one prefix of FRR's BGP table.
type routerRoute struct {
	Valid    bool `json:"valid"`
	Stale    bool `json:"stale"`
	Nexthops []struct {
		IP string `json:"ip"`
	} `json:"nexthops"`
}

// routerTable is FRR's BGP table of a family, by prefix.
func (f *fabric) routerTable(v6 bool) (map[string][]routerRoute, error) {
	out, err := f.vtysh(fmt.Sprintf("show bgp ipv%d unicast json", 4+2*b2i(v6)))
	if err != nil {
		return nil, err
	}
	var tbl struct {
		Routes map[string][]routerRoute `json:"routes"`
	}
	if err := json.Unmarshal(out, &tbl); err != nil {
		return nil, fmt.Errorf("show bgp json: %v: %s", err, out)
	}
	return tbl.Routes, nil
}

// kernelRoutes are the BGP-learned routes in n's kernel, by destination.
func kernelRoutes(n *node) (map[netip.Prefix]netlink.Route, error) {
	out := map[netip.Prefix]netlink.Route{}
	err := n.NS.Do(func(ns.NetNS) error {
		rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: bgp.RouteProtocol, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		for _, r := range rs {
			if r.Dst != nil {
				p, _ := netip.ParsePrefix(r.Dst.String())
				out[p] = r
			}
		}
		return err
	})
	return out, err
}

// waitRoutes waits until the router has every node's blocks and every
// node's kernel the blocks of the others.
func (f *fabric) waitRoutes(d time.Duration, nodes []*node) error {
	return eventually(d, func() error {
		for _, v6 := range []bool{false, true} {
			tbl, err := f.routerTable(v6)
			if err != nil {
				return err
			}
			for _, n := range nodes {
				b := n.blocks()[b2i(v6)]
				if rs := tbl[b.String()]; len(rs) == 0 || !rs[0].Valid {
					return fmt.Errorf("router: no valid route to %s (%s)", b, n.Name)
				}
			}
		}
		for _, n := range nodes {
			krs, err := kernelRoutes(n)
			if err != nil {
				return err
			}
			for _, o := range nodes {
				for _, b := range o.blocks() {
					_, ok := krs[b]
					if o != n && !ok {
						return fmt.Errorf("%s kernel: no route to %s (%s)", n.Name, b, o.Name)
					}
					if o == n && ok {
						return fmt.Errorf("%s kernel: a BGP route to its own block %s", n.Name, b)
					}
				}
			}
		}
		return nil
	})
}

func (f *fabric) checkRoutes(t *testing.T) {
	start := time.Now()
	if err := f.waitRoutes(30*time.Second, f.nodes); err != nil {
		t.Fatal(err)
	}
	t.Logf("all blocks in the router and every kernel %v after the pods were up", time.Since(start).Round(time.Millisecond))
	// Across racks the next hop is the router; within a rack, the peer node.
	krs, _ := kernelRoutes(f.nodes[0])
	if gw := krs[f.nodes[2].blocks()[0]].Gw.String(); gw != rackAddr(0, 254, false).String() {
		t.Errorf("node0 -> node2's block via %s, want the router %s", gw, rackAddr(0, 254, false))
	}
	if gw := krs[f.nodes[1].blocks()[0]].Gw.String(); gw != f.nodes[1].fabricAddr(false).String() {
		t.Errorf("node0 -> node1's block via %s, want node1 %s", gw, f.nodes[1].fabricAddr(false))
	}
}

func (f *fabric) checkHijackRefused(t *testing.T) {
	n0, n2 := f.nodes[0], f.nodes[2]
	if err := eventually(10*time.Second, func() error {
		krs, err := kernelRoutes(n2)
		if _, ok := krs[hijack]; !ok && err == nil {
			err = fmt.Errorf("node2 has no route to %s: the router did not send it", hijack)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	krs, err := kernelRoutes(n0)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := krs[hijack]; ok {
		t.Errorf("node0 installed %v, inside its own block", r)
	}
	if !n0.LogContains("learned route not installed") {
		t.Errorf("node0's log does not say why %s was not installed", hijack)
	}
}

// checkGracefulRestart SIGKILLs node0's daemon under cross-rack streams:
// the router keeps its routes (stale) while it is down, the streams never
// stop, and after the restart the routes are fresh again.
func (f *fabric) checkGracefulRestart(t *testing.T) {
	n0, n2 := f.nodes[0], f.nodes[2]
	var streams []*stream
	for _, v6 := range []bool{false, true} {
		streams = append(streams, startStream(t, n0.pods[0].NS, n2.pods[0].addr(v6)), startStream(t, n2.pods[0].NS, n0.pods[0].addr(v6)))
	}
	if err := n0.StopDaemon(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The router notices the closed session and marks the routes stale.
	if err := eventually(10*time.Second, func() error {
		for _, v6 := range []bool{false, true} {
			tbl, err := f.routerTable(v6)
			if err != nil {
				return err
			}
			rs := tbl[n0.blocks()[b2i(v6)].String()]
			if len(rs) == 0 {
				return fmt.Errorf("router dropped %s while node0's daemon is down", n0.blocks()[b2i(v6)])
			}
			if !rs[0].Stale {
				return fmt.Errorf("router's route to %s not stale yet", n0.blocks()[b2i(v6)])
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	for i, err := range progressing(streams, 2*time.Second) {
		if err != nil {
			t.Errorf("stream %d with node0's daemon down: %v", i, err)
		}
	}
	if err := n0.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	for i, err := range progressing(streams, 2*time.Second) {
		if err != nil {
			t.Errorf("stream %d after the restart: %v", i, err)
		}
	}
	if err := eventually(20*time.Second, func() error {
		for _, v6 := range []bool{false, true} {
			tbl, err := f.routerTable(v6)
			if err != nil {
				return err
			}
			if rs := tbl[n0.blocks()[b2i(v6)].String()]; len(rs) == 0 || rs[0].Stale {
				return fmt.Errorf("router's route to %s: %+v, want fresh", n0.blocks()[b2i(v6)], rs)
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	for i, s := range streams {
		if n, err := s.finish(); err != nil {
			t.Errorf("stream %d broke after %d exchanges: %v", i, n, err)
		}
	}
	if !n0.LogContains(`"gracefulRestart":true`) {
		t.Errorf("node0's second start was not a graceful restart:\n%s", logLines(n0, "speaker started", "marker"))
	}
	if n0.LogContains(`"msg":"stale route removed"`) {
		t.Errorf("node0's restart removed routes:\n%s", logLines(n0, "stale route removed"))
	}
	if err := f.waitRoutes(10*time.Second, f.nodes); err != nil {
		t.Error(err)
	}
}

// checkNodeLost takes node2 off the fabric as a node that loses power
// behind a switch: its uplink goes down, so its daemon's death sends the
// router nothing (no FIN, no RST, in either family), while rack 2's
// bridge keeps its carrier through another port, so FRR's fast external
// failover cannot tell either; only the hold timer can. The speaker does
// not advertise RFC 8538's N-bit, so the router's hold-timer expiry is no
// restart: within the hold time node2's blocks are gone from the router
// and from node0's kernel, the restart time does not add to it.
func (f *fabric) checkNodeLost(t *testing.T) {
	n0, n2 := f.nodes[0], f.nodes[2]
	if err := f.waitRoutes(20*time.Second, f.nodes); err != nil {
		t.Fatalf("before node2 goes: %v", err)
	}
	// The switch's other port: a veth whose two ends stay in the router.
	other := "sw-" + harness.RandomSuffix(6)
	if err := f.underlay.Do(func(ns.NetNS) error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: other}, PeerName: other + "p"}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		p, err := netlink.LinkByName(other + "p")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(p)
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.bridgePort(other, f.bridges[1]); err != nil {
		t.Fatal(err)
	}
	if err := n2.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("uplink0")
		if err != nil {
			return err
		}
		return netlink.LinkSetDown(l)
	}); err != nil {
		t.Fatal(err)
	}
	if err := n2.StopDaemon(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := eventually(fabricHold+2*time.Second, func() error {
		for _, v6 := range []bool{false, true} {
			tbl, err := f.routerTable(v6)
			if err != nil {
				return err
			}
			if rs := tbl[n2.blocks()[b2i(v6)].String()]; len(rs) > 0 {
				return fmt.Errorf("router still has %s: %+v", n2.blocks()[b2i(v6)], rs)
			}
		}
		krs, err := kernelRoutes(n0)
		if err != nil {
			return err
		}
		for _, b := range n2.blocks() {
			if _, ok := krs[b]; ok {
				return fmt.Errorf("node0 still routes %s", b)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v after %v", err, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("node2's blocks withdrawn from the router and node0 %v after it went away (hold time %v, restart time %v not added)", time.Since(start).Round(time.Millisecond), fabricHold, fabricRestart)
	// The rest of the fabric is untouched.
	if _, err := dialName(n0.pods[0].NS, f.nodes[1].pods[0].addr(true), 2*time.Second); err != nil {
		t.Errorf("node0 -> node1 after node2 left: %v", err)
	}
}

// logLines are the lines of n's daemon log containing one of subs.
func logLines(n *node, subs ...string) string {
	var out []string
	for _, l := range strings.Split(n.LogTail(1<<20), "\n") {
		for _, s := range subs {
			if strings.Contains(l, s) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// checkStatus: coordinoctl status shows each session with its state and
// prefix counts; node1's MD5 session is up, its unanswered peer is not and
// nothing is learned from it; no log holds the password.
func (f *fabric) checkStatus(t *testing.T) {
	n1 := f.nodes[1]
	var out string
	if err := eventually(10*time.Second, func() error {
		o, err := exec.Command(filepath.Join(harness.BinDir(), "coordinoctl"), "status", "--socket", filepath.Join(n1.RunDir, "inspect.sock")).CombinedOutput()
		out = string(o)
		if err != nil {
			return fmt.Errorf("coordinoctl status: %v: %s", err, o)
		}
		for _, re := range []string{
			// One block of the session's family sent.
			fmt.Sprintf(`(?m)^(BGP:)?\s+%s  AS %d  Established  [1-9]\d* received, [1-9]\d* accepted, 1 sent$`, regexp.QuoteMeta(rackAddr(0, 254, false).String()), routerASN),
			fmt.Sprintf(`(?m)^(BGP:)?\s+%s  AS %d  Established  [1-9]\d* received, [1-9]\d* accepted, 1 sent$`, regexp.QuoteMeta(rackAddr(0, 254, true).String()), routerASN),
			fmt.Sprintf(`(?m)^(BGP:)?\s+%s  AS %d  (Idle|Connect|Active)  0 received, 0 accepted, 0 sent`, regexp.QuoteMeta(unansweredPeer.String()), routerASN),
		} {
			if !regexp.MustCompile(re).MatchString(out) {
				return fmt.Errorf("no line matching %s", re)
			}
		}
		return nil
	}); err != nil {
		t.Errorf("%v\n%s", err, out)
	}
	if strings.Contains(out, fabricPassword) {
		t.Error("coordinoctl status shows the MD5 password")
	}
	for _, n := range f.nodes {
		if n.LogContains(fabricPassword) {
			t.Errorf("%s's daemon log holds the MD5 password", n.Name)
		}
	}
}

// extraPrefixes are n consecutive /28s from 10.200.0.0 on.
func extraPrefixes(n int) []netip.Prefix {
	out := make([]netip.Prefix, n)
	for i := range out {
		a := uint32(10)<<24 | 200<<16 | uint32(i)<<4
		out[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}), 28)
	}
	return out
}

// checkWrongASN adds node3 to rack 2 configured with a wrong AS for the
// router: it refuses the router's OPEN, its status says why, nothing is
// installed on it, and it announces nothing to the others.
func (f *fabric) checkWrongASN(t *testing.T) {
	n3 := f.addNode()
	cfgPath := filepath.Join(n3.Dir, "bgp.yaml")
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	wrong := strings.Replace(string(data), fmt.Sprintf("asn: %d", routerASN), "asn: 65099", 1)
	if err := os.WriteFile(cfgPath, []byte(wrong), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := n3.fabricAddr(false)
	if _, err := f.vtysh(fmt.Sprintf("conf t\nrouter bgp %d\nneighbor %s remote-as %d\naddress-family ipv4 unicast\nneighbor %s activate", routerASN, addr, 64601+n3.index, addr)); err != nil {
		// vtysh takes one command per -c; fall back to that form.
		out, err := exec.Command("vtysh", "--vty_socket", f.frrDir, "-c", "conf t", "-c", fmt.Sprintf("router bgp %d", routerASN),
			"-c", fmt.Sprintf("neighbor %s remote-as %d", addr, 64601+n3.index), "-c", "address-family ipv4 unicast",
			"-c", fmt.Sprintf("neighbor %s activate", addr)).CombinedOutput()
		if err != nil {
			t.Fatalf("configure the router for node3: %v: %s", err, out)
		}
	}
	f.startDaemon(n3)
	var out string
	if err := eventually(20*time.Second, func() error {
		o, err := exec.Command(filepath.Join(harness.BinDir(), "coordinoctl"), "status", "--socket", filepath.Join(n3.RunDir, "inspect.sock")).CombinedOutput()
		out = string(o)
		if err != nil {
			return fmt.Errorf("coordinoctl status: %v", err)
		}
		re := fmt.Sprintf(`(?m)^BGP:\s+%s  AS 65099  (Idle|Connect|Active|OpenSent)  0 received, 0 accepted, 0 sent  \(bad-peer-as\)$`, regexp.QuoteMeta(rackAddr(1, 254, false).String()))
		if !regexp.MustCompile(re).MatchString(out) {
			return fmt.Errorf("no line matching %s", re)
		}
		return nil
	}); err != nil {
		t.Errorf("%v\n%s", err, out)
	}
	krs, err := kernelRoutes(n3)
	if err != nil {
		t.Fatal(err)
	}
	if len(krs) != 0 {
		t.Errorf("node3 installed %d routes over a refused session", len(krs))
	}
	tbl, err := f.routerTable(false)
	if err != nil {
		t.Fatal(err)
	}
	if rs := tbl[n3.blocks()[0].String()]; len(rs) > 0 {
		t.Errorf("the router learned node3's block over a refused session: %+v", rs)
	}
}
