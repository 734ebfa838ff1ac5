// Package testnet builds throwaway network namespaces for privileged tests:
// a "node" (the test process's own, fresh netns), "pods" behind veths routed
// like Coordino's primary mode, and a private bpffs for pins.
package testnet

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const reexecEnv = "COORDINO_TEST_NODE_NETNS"

// Main runs the tests inside a new network namespace when root: the process
// re-executes itself from a thread that unshared its netns, so every test
// runs in a private "node" netns that vanishes with the process.
func Main(m *testing.M) {
	// The variable names the process that owns the netns: fuzz workers are
	// its children (same netns and environment) and need their own node.
	self := strconv.Itoa(os.Getpid())
	if os.Geteuid() == 0 && os.Getenv(reexecEnv) != self {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			fmt.Fprintln(os.Stderr, "unshare netns:", err)
			os.Exit(1)
		}
		env := []string{reexecEnv + "=" + self}
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, reexecEnv+"=") {
				env = append(env, kv)
			}
		}
		err := unix.Exec("/proc/self/exe", os.Args, env)
		fmt.Fprintln(os.Stderr, "re-exec in netns:", err)
		os.Exit(1)
	}
	if os.Getenv(reexecEnv) == self {
		if err := nodeSetup(); err != nil {
			fmt.Fprintln(os.Stderr, "node netns setup:", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

// NodeIP and NodeIP6 are the node's addresses inside the test netns
// (TEST-NET-1, documentation prefix).
var (
	NodeIP  = netip.MustParseAddr("192.0.2.1")
	NodeIP6 = netip.MustParseAddr("2001:db8:ffff::1")
)

func nodeSetup() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	// The node address lives on lo: this kernel may lack the dummy driver.
	if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(NodeIP, 32))}); err != nil {
		return err
	}
	if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(NodeIP6, 128)), Flags: unix.IFA_F_NODAD}); err != nil {
		return err
	}
	for path, v := range map[string]string{
		"/proc/sys/net/ipv6/conf/all/forwarding":    "1",
		"/proc/sys/net/ipv4/ip_forward":             "1",
		"/proc/sys/net/ipv4/conf/all/rp_filter":     "0",
		"/proc/sys/net/ipv4/conf/default/rp_filter": "0",
	} {
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// BPFDir returns a private bpffs directory removed (with all pins) at cleanup.
func BPFDir(t testing.TB) string {
	t.Helper()
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/bpf", &st) == nil && uint32(st.Type) == unix.BPF_FS_MAGIC {
		dir := filepath.Join("/sys/fs/bpf", "coordino-test-"+randHex(6))
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		return dir
	}
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Pod is a network namespace with eth0 routed through a host veth.
type Pod struct {
	Name string
	// IP is the first of IPs, the pod's addresses (at most one per family).
	IP          netip.Addr
	IPs         []netip.Addr
	HostIfName  string
	HostIfIndex int
	NS          netns.NsHandle
}

var (
	gateway  = netip.MustParseAddr("169.254.1.1")
	gateway6 = netip.MustParseAddr("fe80::1")
)

// NewPod creates a pod netns with address ip and any extra addresses (one
// IPv6 makes it dual-stack); everything is removed at cleanup.
func NewPod(t testing.TB, name string, ip netip.Addr, extra ...netip.Addr) *Pod {
	t.Helper()
	p := &Pod{Name: name, IP: ip, IPs: append([]netip.Addr{ip}, extra...), HostIfName: "cdt" + randHex(5)}
	ns, err := newNS()
	if err != nil {
		t.Fatalf("pod %s: create netns: %v", name, err)
	}
	p.NS = ns
	t.Cleanup(func() { _ = p.NS.Close() })
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.HostIfName}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("pod %s: create veth: %v", name, err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(p.HostIfName); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	if err := p.setup(); err != nil {
		t.Fatalf("pod %s: %v", name, err)
	}
	p.Serve(t)
	return p
}

func newNS() (netns.NsHandle, error) {
	ch := make(chan struct {
		ns  netns.NsHandle
		err error
	})
	go func() {
		runtime.LockOSThread()
		// This thread ends in the new netns; never unlock so it is discarded.
		ns, err := netns.New()
		ch <- struct {
			ns  netns.NsHandle
			err error
		}{ns, err}
	}()
	r := <-ch
	return r.ns, r.err
}

func (p *Pod) setup() error {
	host, err := netlink.LinkByName(p.HostIfName)
	if err != nil {
		return err
	}
	p.HostIfIndex = host.Attrs().Index
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(p.NS)
	if err != nil {
		return err
	}
	defer h.Close()
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	for _, l := range []netlink.Link{lo, eth0} {
		if err := h.LinkSetUp(l); err != nil {
			return err
		}
	}
	for _, ip := range p.IPs {
		if err := p.route(h, host, eth0, ip); err != nil {
			return err
		}
	}
	return nil
}

// route gives the pod ip with a default route via the link-local gateway
// of its family, and the node a host route and neighbour entry back.
func (p *Pod) route(h *netlink.Handle, host, eth0 netlink.Link, ip netip.Addr) error {
	bits, gw, fam := 32, gateway, unix.AF_INET
	if ip.Is6() {
		bits, gw, fam = 128, gateway6, unix.AF_INET6
	}
	if err := h.AddrAdd(eth0, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(ip, bits)), Flags: unix.IFA_F_NODAD}); err != nil {
		return err
	}
	if ip.Is4() {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: prefixNet(netip.PrefixFrom(gw, 32)), Scope: netlink.SCOPE_LINK}); err != nil {
			return fmt.Errorf("gateway route: %w", err)
		}
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	if err := h.NeighAdd(&netlink.Neigh{LinkIndex: eth0.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: gw.AsSlice(), HardwareAddr: host.Attrs().HardwareAddr, Family: fam}); err != nil {
		return fmt.Errorf("gateway neighbour: %w", err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: p.HostIfIndex, Dst: prefixNet(netip.PrefixFrom(ip, bits)), Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("host route: %w", err)
	}
	return netlink.NeighAdd(&netlink.Neigh{LinkIndex: p.HostIfIndex, State: netlink.NUD_PERMANENT,
		IP: ip.AsSlice(), HardwareAddr: eth0.Attrs().HardwareAddr, Family: fam})
}

// Do runs fn on a thread inside the pod's netns; sockets fn opens stay there.
func (p *Pod) Do(fn func() error) error {
	return InNS(p.NS, fn)
}

// InNS runs fn on a thread switched into ns.
func InNS(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Ports served by every pod, TCP and UDP, echoing what they receive.
var Ports = []int{80, 81}

// Serve starts TCP and UDP echo servers on Ports inside the pod.
func (p *Pod) Serve(t testing.TB) {
	t.Helper()
	err := p.Do(func() error {
		for _, port := range Ports {
			if err := serveTCPEcho(t, "tcp4", ":"+strconv.Itoa(port)); err != nil {
				return err
			}
			pc, err := net.ListenPacket("udp4", ":"+strconv.Itoa(port))
			if err != nil {
				return err
			}
			t.Cleanup(func() { pc.Close() })
			go func() {
				buf := make([]byte, 2048)
				for {
					n, addr, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = pc.WriteTo(buf[:n], addr)
				}
			}()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pod %s: serve: %v", p.Name, err)
	}
}

// ServeTCP starts a TCP echo server on network ("tcp4", "tcp6") and
// address inside the pod, e.g. an IPv6 one (Serve listens on IPv4).
func (p *Pod) ServeTCP(t testing.TB, network, addr string) {
	t.Helper()
	if err := p.Do(func() error { return serveTCPEcho(t, network, addr) }); err != nil {
		t.Fatalf("pod %s: serve %s %s: %v", p.Name, network, addr, err)
	}
}

// ServeNodeTCP starts a TCP echo server on network and address in the
// node netns (the test process's own).
func ServeNodeTCP(t testing.TB, network, addr string) {
	t.Helper()
	if err := serveTCPEcho(t, network, addr); err != nil {
		t.Fatalf("node: serve %s %s: %v", network, addr, err)
	}
}

// serveTCPEcho listens in the calling thread's netns until cleanup.
func serveTCPEcho(t testing.TB, network, addr string) error {
	ln, err := net.Listen(network, addr)
	if err != nil {
		return err
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return nil
}

// Timeout bounds each probe; a dropped SYN or datagram shows as a timeout.
const Timeout = 700 * time.Millisecond

// Dial opens a TCP connection from the pod.
func (p *Pod) Dial(dst netip.Addr, port int) (net.Conn, error) {
	var c net.Conn
	err := p.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(dst, uint16(port)).String(), Timeout)
		return err
	})
	return c, err
}

// Echo sends a line on c and waits for it to come back.
func Echo(c net.Conn) error {
	msg := []byte("ping " + randHex(4))
	_ = c.SetDeadline(time.Now().Add(Timeout))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != string(msg) {
		return errors.New("echo mismatch")
	}
	return nil
}

// Probe reports whether a TCP, UDP or SCTP exchange from the pod to dst:port works.
func (p *Pod) Probe(proto string, dst netip.Addr, port int) error {
	return p.Do(func() error { return probe(proto, dst, port) })
}

// ProbeFromNode runs Probe from the node netns itself.
func ProbeFromNode(proto string, dst netip.Addr, port int) error {
	return probe(proto, dst, port)
}

func probe(proto string, dst netip.Addr, port int) error {
	if proto == "sctp" {
		return probeSCTP(dst.As4(), port)
	}
	c, err := net.DialTimeout(proto+"4", netip.AddrPortFrom(dst, uint16(port)).String(), Timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	return Echo(c)
}
