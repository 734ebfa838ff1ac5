package netsetup

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Node addressing inside the test's node netns (never on the real host).
var (
	nodeAddrV4 = netip.MustParsePrefix("192.0.2.1/24")
	nodeGwV4   = netip.MustParseAddr("192.0.2.254")
	nodeAddrV6 = netip.MustParsePrefix("2001:db8:1::1/64")
	nodeGwV6   = netip.MustParseAddr("2001:db8:1::fe")
)

// uplinkMTU is the node uplink's MTU, so tests can tell DefaultMTU from 1500.
const uplinkMTU = 1450

func newNS(t testing.TB) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		n.Close()
		_ = testutils.UnmountNS(n)
	})
	return n
}

// do runs fn inside n and fails the test on error.
func do(t testing.TB, n ns.NetNS, fn func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return fn() }); err != nil {
		t.Fatal(err)
	}
}

// newNode creates a node netns with a veth "uplink" (both ends in the node)
// carrying the node's addresses and default routes.
func newNode(t testing.TB) ns.NetNS {
	t.Helper()
	node := newNS(t)
	do(t, node, func() error {
		up := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0", MTU: uplinkMTU, TxQLen: -1}, PeerName: "uplink1", PeerTxQLen: -1}
		if err := netlink.LinkAdd(up); err != nil {
			return fmt.Errorf("add uplink: %w", err)
		}
		for _, name := range []string{"lo", "uplink0", "uplink1"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return fmt.Errorf("set %s up: %w", name, err)
			}
		}
		l, _ := netlink.LinkByName("uplink0")
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(nodeAddrV4)}); err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipNet(nodeAddrV6), Flags: unix.IFA_F_NODAD}); err != nil {
			return err
		}
		for _, gw := range []netip.Addr{nodeGwV4, nodeGwV6} {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
				return fmt.Errorf("add default route via %s: %w", gw, err)
			}
		}
		return nil
	})
	return node
}

func randSuffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// podCfg returns a config for a fresh pod netns with the given addresses.
func podCfg(t testing.TB, addrs ...string) PodConfig {
	t.Helper()
	pod := newNS(t)
	cfg := PodConfig{
		NetNSPath:  pod.Path(),
		IfName:     "eth0",
		HostIfName: HostIfName("test", randSuffix(), "eth0"),
	}
	for _, a := range addrs {
		cfg.Addrs = append(cfg.Addrs, netip.MustParsePrefix(a))
	}
	return cfg
}

// setup runs SetupPod inside node and tears the pod down at test end.
func setup(t testing.TB, node ns.NetNS, cfg PodConfig) *Attachment {
	t.Helper()
	var att *Attachment
	do(t, node, func() (err error) {
		att, err = SetupPod(cfg)
		return err
	})
	t.Cleanup(func() {
		_ = node.Do(func(ns.NetNS) error { return TeardownPod(cfg.HostIfName) })
	})
	return att
}

func check(node ns.NetNS, cfg PodConfig) error {
	var cerr error
	if err := node.Do(func(ns.NetNS) error { cerr = CheckPod(cfg); return nil }); err != nil {
		return err
	}
	return cerr
}

func inPod(t testing.TB, cfg PodConfig, fn func() error) {
	t.Helper()
	pod, err := ns.GetNS(cfg.NetNSPath)
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	do(t, pod, fn)
}

// echoServer listens on addr inside n and echoes one line per connection.
func echoServer(t testing.TB, n ns.NetNS, addr netip.Addr) string {
	t.Helper()
	var ln net.Listener
	do(t, n, func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		return err
	})
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil {
					io.WriteString(c, line)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// tcpRoundTrip dials target from inside n, sends a line and expects it back.
func tcpRoundTrip(n ns.NetNS, target string) error {
	return n.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", target, 3*time.Second)
		if err != nil {
			return fmt.Errorf("dial %s: %w", target, err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		const msg = "coordino\n"
		if _, err := io.WriteString(c, msg); err != nil {
			return fmt.Errorf("write to %s: %w", target, err)
		}
		got, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || got != msg {
			return fmt.Errorf("echo from %s: got %q, %v", target, got, err)
		}
		return nil
	})
}

func getNS(t testing.TB, path string) ns.NetNS {
	t.Helper()
	n, err := ns.GetNS(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func linkExists(name string) bool {
	_, err := netlink.LinkByName(name)
	return err == nil
}

func writeSysctl(path, v string) error {
	return os.WriteFile(path, []byte(v), 0o644)
}

func readSysctl(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
