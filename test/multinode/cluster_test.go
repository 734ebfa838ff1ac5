package multinode

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/daemon/peers"
	"github.com/coordino/coordino/daemon/wireguard"
	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// mode is one cross-node datapath under test.
type mode struct {
	name       string
	routing    string
	encryption string
	overhead   int
	// v6Underlay lists only IPv6 node addresses in the peers file: IPv4
	// pods then cross an IPv6-only underlay.
	v6Underlay bool
	// wgKind is the daemons' --wireguard-device-kind with encryption:
	// explicit, so that a mode tests the device it names on any kernel.
	wgKind string
}

var (
	direct   = mode{"direct", "direct", "none", 0, false, ""}
	direct6  = mode{"direct-ipv6-underlay", "direct", "none", 0, true, ""}
	vxlan    = mode{"vxlan", "vxlan", "none", 50, false, ""}
	vxlan6   = mode{"vxlan-ipv6-underlay", "vxlan", "none", 70, true, ""}
	wgUser   = mode{"wireguard-userspace", "direct", "wireguard", 80, false, wireguard.KindUserspace}
	wgKernel = mode{"wireguard-kernel", "direct", "wireguard", 80, false, wireguard.KindKernel}
	allModes = []mode{direct, direct6, vxlan, vxlan6, wgUser, wgKernel}
	// wgModes are the two WireGuard devices.
	wgModes = []mode{wgUser, wgKernel}
)

// linkKind is the netlink link type each device kind must show: the
// kernel's own wireguard link, or the userspace process's TUN.
var linkKind = map[string]string{wireguard.KindKernel: "wireguard", wireguard.KindUserspace: "tuntap"}

// cluster is the underlay namespace with its bridge and the nodes on it.
type cluster struct {
	t        *testing.T
	mode     mode
	underlay ns.NetNS
	bridge   string
	base     string
	nodes    []*node
	// nodeArgs, when set, adds daemon flags per node (given its dir).
	nodeArgs func(dir string) []string
	// kube is the API server and controller in Kubernetes mode (nil:
	// standalone with peers files).
	kube *kubeEnv
	// tunnelsLogged: logTunnels ran (once is enough to read a failure).
	tunnelsLogged bool
}

// node is a harness node plus what the test bed knows about it.
type node struct {
	*harness.Node
	index     int
	peersFile string
	wgDevice  string
	cni       *harness.CNI
	pods      []*pod
}

type pod struct {
	*harness.Pod
	node  *node
	addrs []netip.Addr
}

func (n *node) address(v6 bool) netip.Addr {
	if v6 {
		return netip.MustParseAddr(fmt.Sprintf("2001:db8::%d", n.index+1))
	}
	return netip.MustParseAddr(fmt.Sprintf("192.0.2.%d", n.index+1))
}

func (n *node) blocks() []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix(fmt.Sprintf("10.10.%d.0/24", n.index)),
		netip.MustParsePrefix(fmt.Sprintf("fd00:10:%d::/64", n.index)),
	}
}

func (p *pod) addr(v6 bool) netip.Addr {
	for _, a := range p.addrs {
		if a.Is6() == v6 {
			return a
		}
	}
	panic("pod has no address of the family")
}

// newCluster creates the underlay and count nodes with running daemons;
// the peers file lists all of them (and, with WireGuard, their keys).
func newCluster(t *testing.T, m mode, count int) *cluster {
	t.Helper()
	return newClusterWith(t, m, count, nil)
}

// newClusterWith is newCluster with extra daemon flags per node.
func newClusterWith(t *testing.T, m mode, count int, nodeArgs func(dir string) []string) *cluster {
	t.Helper()
	c := newUnderlay(t, m)
	c.nodeArgs = nodeArgs
	for i := 0; i < count; i++ {
		c.addNode()
	}
	c.writePeers(c.nodes)
	for _, n := range c.nodes {
		c.startDaemon(n)
	}
	if m.encryption == "wireguard" {
		// Keys exist only once each daemon ran: distribute them now, as an
		// operator would.
		c.writePeers(c.nodes)
		c.waitTunnels()
		for _, n := range c.nodes {
			c.requireDeviceKind(n)
		}
	}
	return c
}

// requireDeviceKind fails the test unless n's WireGuard device is a link of
// the mode's kind: a kernel mode that ran the userspace process (or the
// reverse) would test the other device under this one's name.
func (c *cluster) requireDeviceKind(n *node) {
	c.t.Helper()
	if got := n.wgLink(c.t).Type(); got != linkKind[c.mode.wgKind] {
		c.t.Fatalf("%s: device %s is a %q link, want %q (--wireguard-device-kind=%s)", n.Name, n.wgDevice, got, linkKind[c.mode.wgKind], c.mode.wgKind)
	}
}

// wgState is n's WireGuard device as its daemon sees it, asked from inside
// n's namespace: the kernel's device answers on the generic netlink of its
// own namespace only (the userspace one on a socket file, from anywhere).
func (n *node) wgState() (*wgtypes.Device, error) {
	var dev *wgtypes.Device
	err := n.NS.Do(func(ns.NetNS) error {
		client, err := wgctrl.New()
		if err != nil {
			return err
		}
		defer client.Close()
		dev, err = client.Device(n.wgDevice)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: WireGuard device %s: %w", n.Name, n.wgDevice, err)
	}
	return dev, nil
}

// wgLink is n's WireGuard device.
func (n *node) wgLink(t *testing.T) netlink.Link {
	t.Helper()
	var l netlink.Link
	if err := n.NS.Do(func(ns.NetNS) (err error) {
		l, err = netlink.LinkByName(n.wgDevice)
		return err
	}); err != nil {
		t.Fatalf("%s: WireGuard device %s: %v", n.Name, n.wgDevice, err)
	}
	return l
}

// newUnderlay creates the underlay namespace and its bridge.
func newUnderlay(t *testing.T, m mode) *cluster {
	t.Helper()
	privileged.Require(t)
	// Where the kernel does not claim WireGuard the kernel device cannot be
	// tested; where it does, a device that fails is a failure.
	if m.wgKind == wireguard.KindKernel && !kernel.Probe().Has(kernel.WireGuard) {
		t.Skipf("the kernel has no %s (docs/kernels.md)", kernel.WireGuard)
	}
	if err := harness.RequireBinaries(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(harness.BinDir(), "coordino-wireguard")); err != nil {
		t.Fatal("bin/coordino-wireguard missing: run make build first")
	}
	u, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	// One base dir made before close is registered: TempDir removal runs
	// after close (cleanups run last-in first-out), once mounts are gone.
	c := &cluster{t: t, mode: m, underlay: u, bridge: "br-" + harness.RandomSuffix(6), base: t.TempDir()}
	t.Cleanup(c.close)
	if err := u.Do(func(ns.NetNS) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: c.bridge, MTU: 1500}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		return netlink.LinkSetUp(br)
	}); err != nil {
		t.Fatalf("underlay bridge: %v", err)
	}
	return c
}

func (c *cluster) addNode() *node {
	t := c.t
	i := len(c.nodes)
	n := &node{index: i}
	name := fmt.Sprintf("node%d", i)
	dir := filepath.Join(c.base, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	n.peersFile = filepath.Join(dir, "peers.yaml")
	n.wgDevice = "cwg" + harness.RandomSuffix(8)
	args := []string{"--routing", c.mode.routing, "--encryption", c.mode.encryption, "--wireguard-device", n.wgDevice}
	if c.mode.wgKind != "" {
		args = append(args, "--wireguard-device-kind", c.mode.wgKind)
	}
	if c.kube == nil {
		args = append(args, "--peers-file", n.peersFile)
	}
	if c.nodeArgs != nil {
		args = append(args, c.nodeArgs(dir)...)
	}
	var err error
	n.Node, err = harness.NewNode(dir, name, harness.NodeOptions{
		NodeIP:    n.address(false).String(),
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
	if err := c.plug(n); err != nil {
		t.Fatalf("plug %s into the underlay: %v", name, err)
	}
	return n
}

// plug replaces the harness's stand-alone uplink by a veth whose other end
// is a port of the underlay bridge.
func (c *cluster) plug(n *node) error {
	port := fmt.Sprintf("p%d-%s", n.index, harness.RandomSuffix(6))
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
		for _, a := range []netip.Prefix{netip.PrefixFrom(n.address(false), 24), netip.PrefixFrom(n.address(true), 64)} {
			if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(a), Flags: unix.IFA_F_NODAD}); err != nil {
				return err
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		// A default route, so the daemon measures the uplink MTU as on a node.
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: ipNet(netip.MustParsePrefix("0.0.0.0/0"))})
	}); err != nil {
		return err
	}
	return c.bridgePort(port, c.bridge)
}

// bridgePort makes the underlay's interface port a port of bridge, up.
func (c *cluster) bridgePort(port, bridge string) error {
	return c.underlay.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(port)
		if err != nil {
			return err
		}
		br, err := netlink.LinkByName(bridge)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(l, br); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
}

func (c *cluster) startDaemon(n *node) {
	c.t.Helper()
	if err := n.StartDaemon(); err != nil {
		c.t.Fatalf("%s: %v", n.Name, err)
	}
	if n.cni == nil {
		cni, err := n.NewCNI(n.PrimaryConflist("coordino", "1.1.0"))
		if err != nil {
			c.t.Fatal(err)
		}
		n.cni = cni
	}
}

// peerSet describes members (with WireGuard keys once their daemons made them).
func (c *cluster) peerSet(members []*node) peers.Set {
	s := peers.Set{}
	for _, n := range members {
		p := &peers.Node{Name: n.Name, Addresses: []netip.Addr{n.address(false), n.address(true)}, Blocks: n.blocks()}
		if c.mode.routing == "bgp" {
			p.Addresses = []netip.Addr{n.fabricAddr(false), n.fabricAddr(true)}
		}
		if c.mode.v6Underlay {
			p.Addresses = p.Addresses[1:]
		}
		if data, err := os.ReadFile(filepath.Join(n.StateDir, wireguard.PublicKeyFile)); err == nil {
			p.WireGuard = &peers.WireGuard{PublicKey: strings.TrimSpace(string(data))}
		}
		s[n.Name] = p
	}
	return s
}

// writePeers gives every node (members or not) a peers file listing members,
// written atomically as a config-management tool would.
func (c *cluster) writePeers(members []*node) {
	c.t.Helper()
	data := c.peersFile(members)
	for _, n := range c.nodes {
		c.writePeersFile(n, data)
	}
}

// peersFile is the peers file listing members.
func (c *cluster) peersFile(members []*node) []byte {
	c.t.Helper()
	data, err := peers.MarshalFile(c.peerSet(members))
	if err != nil {
		c.t.Fatal(err)
	}
	return data
}

// writePeersFile gives n the peers file data (atomically).
func (c *cluster) writePeersFile(n *node, data []byte) {
	c.t.Helper()
	tmp := n.peersFile + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, n.peersFile); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) addPod(n *node) *pod {
	c.t.Helper()
	hp, err := harness.NewPod(fmt.Sprintf("pod-%s-%d", n.Name, len(n.pods)))
	if err != nil {
		c.t.Fatal(err)
	}
	return c.attach(n, hp, harness.RuntimeConf(hp, "eth0"))
}

// attach runs ADD for hp on n, as a runtime would, and records the pod.
func (c *cluster) attach(n *node, hp *harness.Pod, rt *libcni.RuntimeConf) *pod {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := n.cni.Add(ctx, rt)
	if err != nil {
		hp.Close()
		c.t.Fatalf("ADD on %s: %v\n%s", n.Name, err, n.LogTail(30))
	}
	addrs, err := harness.Addresses(res)
	if err != nil {
		c.t.Fatal(err)
	}
	p := &pod{Pod: hp, node: n, addrs: addrs}
	n.pods = append(n.pods, p)
	return p
}

// wgPID is the userspace WireGuard process of n, or 0.
func (n *node) wgPID() int {
	data, err := os.ReadFile(wireguard.PIDFile(n.RunDir, n.wgDevice))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(data)))
	return pid
}

func (c *cluster) close() {
	for _, n := range c.nodes {
		if c.t.Failed() {
			c.t.Logf("%s daemon log tail:\n%s", n.Name, n.LogTail(40))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		for _, p := range n.pods {
			_ = n.cni.Del(ctx, harness.RuntimeConf(p.Pod, "eth0"))
			p.Close()
		}
		cancel()
		n.Close()
		// The userspace device outlives the daemon by design: end it by PID.
		if pid := n.wgPID(); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGTERM)
			waitGone(pid, 5*time.Second)
		}
	}
	if c.underlay != nil {
		_ = c.underlay.Close()
		_ = testutils.UnmountNS(c.underlay)
	}
}

func waitGone(pid int, d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); err != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// linkAttrs are the attributes of the interface name in netns n.
func linkAttrs(t *testing.T, n ns.NetNS, name string) *netlink.LinkAttrs {
	t.Helper()
	var attrs *netlink.LinkAttrs
	if err := n.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(name)
		if err == nil {
			attrs = l.Attrs()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return attrs
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// eventually retries f until it succeeds or d passes.
func eventually(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
