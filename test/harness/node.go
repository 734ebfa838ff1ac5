package harness

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/privileged"
)

// Node is a simulated Kubernetes node: a network namespace with an
// underlay address and, once started, a coordino-daemon serving in it.
type Node struct {
	Name     string
	NS       ns.NetNS
	Dir      string // scratch dir: run, state, logs
	RunDir   string
	StateDir string
	BPFDir   string
	PodCIDRs []string
	// NodeIP is the underlay address, the source of node→pod traffic.
	NodeIP    netip.Addr
	ExtraArgs []string
	// Kubeconfig, when set, runs the daemon in Kubernetes mode against it
	// (no --standalone, no --pod-cidr: blocks come from the NodeConfig).
	Kubeconfig string
	// DaemonBinary, when set, is run instead of bin/coordino-daemon (a
	// benchmark's baseline build).
	DaemonBinary string
	// StartTimeout bounds StartDaemon's wait for the socket (default 15 s,
	// scaled by privileged.Slowdown).
	StartTimeout time.Duration

	daemon  *exec.Cmd
	exited  chan struct{}
	logPath string
}

// NodeOptions shape a Node.
type NodeOptions struct {
	PodCIDRs []string
	// NodeIP is the IPv4 node address, default 192.0.2.1 (TEST-NET-1,
	// only inside the node netns); every node also gets 2001:db8::1.
	NodeIP string
	// ExtraArgs are appended to the daemon's command line.
	ExtraArgs []string
	// DaemonBinary replaces bin/coordino-daemon when set.
	DaemonBinary string
}

// RandomSuffix returns n random hex characters for unique names.
func RandomSuffix(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// NewNode creates the node netns and its directories under dir (a test's
// TempDir). Close removes everything it created.
func NewNode(dir, name string, opts NodeOptions) (*Node, error) {
	nodeNS, err := testutils.NewNS()
	if err != nil {
		return nil, fmt.Errorf("create node netns: %w", err)
	}
	ipStr := opts.NodeIP
	if ipStr == "" {
		ipStr = "192.0.2.1"
	}
	n := &Node{
		Name:      name,
		NS:        nodeNS,
		Dir:       dir,
		RunDir:    filepath.Join(dir, "run"),
		StateDir:  filepath.Join(dir, "state"),
		BPFDir:    filepath.Join(dir, "bpffs", "coordino"),
		PodCIDRs:  opts.PodCIDRs,
		NodeIP:    netip.MustParseAddr(ipStr),
		ExtraArgs: opts.ExtraArgs,
		logPath:   filepath.Join(dir, "daemon.log"),

		DaemonBinary: opts.DaemonBinary,
	}
	// A private bpffs per node: pins vanish with the test, and the host's
	// /sys/fs/bpf (not even mounted on some machines) is never touched.
	if err := os.MkdirAll(n.bpffs(), 0o700); err != nil {
		n.Close()
		return nil, err
	}
	if err := syscall.Mount("bpf", n.bpffs(), "bpf", 0, "mode=0700"); err != nil {
		n.Close()
		return nil, fmt.Errorf("mount bpffs for node: %w", err)
	}
	if err := nodeNS.Do(func(ns.NetNS) error { return n.setupUnderlay() }); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// setupUnderlay brings lo up and gives the node an address on an uplink
// with a default route, as a real node has. The uplink is a veth whose peer
// stays in the node netns (this kernel has no dummy driver).
func (n *Node) setupUnderlay() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	dummy := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink0", MTU: 1500}, PeerName: "uplink0-peer"}
	if err := netlink.LinkAdd(dummy); err != nil {
		return fmt.Errorf("add uplink0: %w", err)
	}
	for _, name := range []string{"uplink0", "uplink0-peer"} {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
	}
	// An IPv6 node address too (2001:db8::/32 is documentation space), so
	// node→pod IPv6 has a global source as on a real dual-stack node.
	for _, a := range []netip.Prefix{netip.PrefixFrom(n.NodeIP, 24), netip.MustParsePrefix("2001:db8::1/64")} {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(dummy, addr); err != nil {
			return fmt.Errorf("address uplink0: %w", err)
		}
		dflt := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
		if a.Addr().Is6() {
			dflt = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: dummy.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: dflt}); err != nil {
			return fmt.Errorf("default route via uplink0: %w", err)
		}
	}
	return nil
}

func (n *Node) bpffs() string { return filepath.Dir(n.BPFDir) }

// DaemonArgs is the daemon command line for this node.
func (n *Node) DaemonArgs() []string {
	args := []string{"--standalone", "--node-name", n.Name,
		"--run-dir", n.RunDir, "--state-dir", n.StateDir, "--bpf-dir", n.BPFDir,
		"--metrics-addr", "127.0.0.1:0", "--log-level", "debug"}
	if n.Kubeconfig != "" {
		args = append([]string{"--kubeconfig", n.Kubeconfig}, args[1:]...)
		return append(args, n.ExtraArgs...)
	}
	for _, c := range n.PodCIDRs {
		args = append(args, "--pod-cidr", c)
	}
	return append(args, n.ExtraArgs...)
}

// StartDaemon starts coordino-daemon inside the node netns and waits until
// it serves (socket accepts connections).
func (n *Node) StartDaemon() error {
	if err := n.startDaemonProcess(); err != nil {
		return err
	}
	timeout := n.StartTimeout
	if timeout == 0 {
		timeout = 15 * time.Second
	}
	return n.waitServing(privileged.Slowdown(timeout))
}

func (n *Node) startDaemonProcess() error {
	if n.daemon != nil {
		return errors.New("daemon already running")
	}
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(n.RunDir, "metrics.addr"))
	bin := filepath.Join(BinDir(), "coordino-daemon")
	if n.DaemonBinary != "" {
		bin = n.DaemonBinary
	}
	args := append([]string{"--net=" + n.NS.Path(), "--", bin}, n.DaemonArgs()...)
	cmd := exec.Command("nsenter", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// No Pdeathsig: it fires when the forking *thread* exits, and ns.Do
	// retires locked threads, which would kill the daemon at random.
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start daemon: %w", err)
	}
	n.daemon = cmd
	n.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(n.exited) }()
	return nil
}

func (n *Node) waitServing(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	sock := filepath.Join(n.RunDir, "coordino.sock")
	for time.Now().Before(deadline) {
		select {
		case <-n.exited:
			n.daemon = nil
			return fmt.Errorf("daemon exited during start-up; log:\n%s", n.LogTail(40))
		default:
		}
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			if _, err := os.Stat(filepath.Join(n.RunDir, "metrics.addr")); err == nil {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("daemon not serving on %s after %v; log:\n%s", sock, timeout, n.LogTail(40))
}

// DaemonPID is the daemon's PID, or 0.
func (n *Node) DaemonPID() int {
	if n.daemon == nil || n.daemon.Process == nil {
		return 0
	}
	return n.daemon.Process.Pid
}

// StopDaemon sends sig to the daemon (SIGKILL simulates a crash) and waits for it to exit.
func (n *Node) StopDaemon(sig syscall.Signal) error {
	if n.daemon == nil {
		return nil
	}
	// nsenter execs the daemon, so the PID is the daemon's.
	if err := n.daemon.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-n.exited:
	case <-time.After(15 * time.Second):
		_ = n.daemon.Process.Kill()
		<-n.exited
	}
	n.daemon = nil
	return nil
}

// LogTail returns the last lines of the daemon log.
func (n *Node) LogTail(lines int) string {
	data, _ := os.ReadFile(n.logPath)
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// LogContains reports whether the daemon log has a line containing s.
func (n *Node) LogContains(s string) bool {
	f, err := os.Open(n.logPath)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			return true
		}
	}
	return false
}

// HTTPGet fetches path from the daemon's metrics listener, which lives in
// the node netns: the connection is dialled from inside it.
func (n *Node) HTTPGet(path string) (int, string, error) {
	addr, err := os.ReadFile(filepath.Join(n.RunDir, "metrics.addr"))
	if err != nil {
		return 0, "", err
	}
	var conn net.Conn
	if err := n.NS.Do(func(ns.NetNS) error {
		var derr error
		conn, derr = net.DialTimeout("tcp", strings.TrimSpace(string(addr)), 2*time.Second)
		return derr
	}); err != nil {
		return 0, "", fmt.Errorf("dial metrics: %w", err)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) { return conn, nil },
	}}
	resp, err := client.Get("http://" + strings.TrimSpace(string(addr)) + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// Close stops the daemon and removes the node netns, its BPF dir and
// anything the daemon left mounted under its run dir.
func (n *Node) Close() {
	_ = n.StopDaemon(syscall.SIGTERM)
	pins, _ := filepath.Glob(filepath.Join(n.RunDir, "netns", "*"))
	for _, p := range pins {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
	_ = syscall.Unmount(n.bpffs(), syscall.MNT_DETACH)
	if n.NS != nil {
		removeNS(n.NS)
	}
}
