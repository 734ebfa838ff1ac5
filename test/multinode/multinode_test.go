package multinode

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/routing"
	"github.com/coordino/coordino/daemon/wireguard"
	"github.com/coordino/coordino/test/harness"
)

const (
	namePort = 8080
	echoPort = 9090
)

// TestMultinode runs every case of one mode on one three-node cluster, so
// the package stays within its CI budget.
func TestMultinode(t *testing.T) {
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			start := time.Now()
			c := newCluster(t, m, 3)
			addServingPods(t, c)
			capture := startCapture(t, c)
			t.Run("pod-mtu", func(t *testing.T) { checkPodMTU(t, c) })
			t.Run("reachability", func(t *testing.T) { checkReachability(t, c) })
			t.Run("large-transfer", func(t *testing.T) { checkLargeTransfer(t, c) })
			t.Run("full-size-datagrams", func(t *testing.T) { checkFullSizeDatagrams(t, c) })
			t.Run("underlay-capture", func(t *testing.T) { capture.check(t, c) })
			t.Run("peers-leave-and-join", func(t *testing.T) { checkLeaveJoin(t, c) })
			t.Run("daemon-sigkill-under-traffic", func(t *testing.T) { checkRestart(t, c) })
			if m.wgKind == wireguard.KindUserspace {
				// Per host: the process, and the UAPI socket its name makes.
				t.Run("userspace-device-crash", func(t *testing.T) { checkDeviceCrash(t, c) })
				t.Run("container-end-fails-closed", func(t *testing.T) { checkContainerEndFailsClosed(t, c) })
				t.Run("device-name-collision", func(t *testing.T) { checkNameCollision(t, c) })
			}
			if m.encryption == "wireguard" {
				t.Run("encryption-turned-off", func(t *testing.T) { checkEncryptionOff(t, c) })
			}
			t.Logf("%s: %v", m.name, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestWireGuardKernel is the kernel matrix's cut of TestMultinode and
// TestWireGuardKeyRotationNoStall for the kernel's device, on one cluster
// of two nodes: pods reaching pods, only WireGuard UDP on the underlay, key
// rotation under paced flows, both daemons SIGKILLed under traffic. In a
// qemu guest each daemon start costs tens of seconds, and the three
// clusters of those tests would not fit the matrix's time.
func TestWireGuardKernel(t *testing.T) {
	c := newCluster(t, wgKernel, 2)
	addServingPods(t, c)
	capture := startCapture(t, c)
	t.Run("reachability", func(t *testing.T) { checkReachability(t, c) })
	t.Run("underlay-capture", func(t *testing.T) { capture.check(t, c) })
	t.Run("key-rotation-no-stall", func(t *testing.T) { checkRotationNoStall(t, c) })
	t.Run("daemon-sigkill-under-traffic", func(t *testing.T) { checkRestart(t, c) })
}

// addServingPods gives every node a pod serving its name (namePort) and a
// TCP echo (echoPort) on both families.
func addServingPods(t *testing.T, c *cluster) {
	for _, n := range c.nodes {
		p := c.addPod(n)
		for _, v6 := range []bool{false, true} {
			stop, err := serveEcho(p, v6)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(stop)
		}
	}
}

func checkPodMTU(t *testing.T, c *cluster) {
	want := 1500 - c.mode.overhead
	for _, n := range c.nodes {
		p := n.pods[0]
		if got := linkAttrs(t, p.NS, "eth0").MTU; got != want {
			t.Errorf("%s: pod MTU %d, want %d (uplink 1500 minus %d)", p.Name, got, want, c.mode.overhead)
		}
	}
}

// dialName connects from netns to addr and returns the server's name.
func dialName(from ns.NetNS, addr netip.Addr, timeout time.Duration) (string, error) {
	return dialPort(from, addr, namePort, timeout)
}

// dialPort connects from netns to addr:port and returns what the server says.
func dialPort(from ns.NetNS, addr netip.Addr, port int, timeout time.Duration) (string, error) {
	conn, err := harness.DialFrom(from, "tcp", addr, port, timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(conn)
	return string(b), err
}

// checkReachability: every pod reaches every pod on other nodes, and every
// node reaches every pod, over both families.
func checkReachability(t *testing.T, c *cluster) {
	for _, v6 := range []bool{false, true} {
		for _, src := range c.nodes {
			for _, dst := range c.nodes {
				target := dst.pods[0]
				if src != dst {
					if err := reach(src.pods[0].NS, target, v6); err != nil {
						t.Errorf("pod %s -> pod %s (%v): %v", src.pods[0].Name, target.Name, target.addr(v6), err)
						c.logTunnels(t)
					}
				}
				if err := reach(src.NS, target, v6); err != nil {
					t.Errorf("node %s -> pod %s (%v): %v", src.Name, target.Name, target.addr(v6), err)
					c.logTunnels(t)
				}
			}
		}
	}
}

// reach dials target's name server, retrying for a few seconds (right
// after start-up WireGuard may still be handshaking).
func reach(from ns.NetNS, target *pod, v6 bool) error {
	return eventually(5*time.Second, func() error {
		got, err := dialName(from, target.addr(v6), 2*time.Second)
		if err == nil && got != target.Name {
			err = fmt.Errorf("answered by %q", got)
		}
		return err
	})
}

// checkLargeTransfer pushes 8 MiB through an echo across nodes per family:
// a pod MTU larger than the path would stall it.
func checkLargeTransfer(t *testing.T, c *cluster) {
	payload := make([]byte, 8<<20)
	_, _ = rand.Read(payload)
	for _, v6 := range []bool{false, true} {
		src, dst := c.nodes[0].pods[0], c.nodes[1].pods[0]
		conn, err := harness.DialFrom(src.NS, "tcp", dst.addr(v6), echoPort, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		go func() { _, _ = conn.Write(payload) }()
		got := make([]byte, len(payload))
		if _, err := io.ReadFull(conn, got); err != nil {
			t.Errorf("v6=%v: echo of 8 MiB: %v", v6, err)
		} else if !bytes.Equal(got, payload) {
			t.Errorf("v6=%v: echo differs", v6)
		}
		conn.Close()
	}
}

// stream is a long-lived connection exchanging a message every few ms;
// it records the first error.
type stream struct {
	conn  net.Conn
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	err   error
	count int
}

func startStream(t *testing.T, from ns.NetNS, addr netip.Addr) *stream {
	t.Helper()
	conn, err := harness.DialFrom(from, "tcp", addr, echoPort, 3*time.Second)
	if err != nil {
		t.Fatalf("stream to %v: %v", addr, err)
	}
	s := &stream{conn: conn, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		msg := []byte("coordino-stream-ping-0123456789")
		buf := make([]byte, len(msg))
		for {
			select {
			case <-s.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			// Generous: a stalled tunnel must show as an error, a slow
			// shared machine must not.
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := conn.Write(msg); err == nil {
				_, err = io.ReadFull(conn, buf)
				if err == nil && !bytes.Equal(buf, msg) {
					err = fmt.Errorf("echo mismatch")
				}
				if err != nil {
					s.fail(err)
					return
				}
			} else {
				s.fail(err)
				return
			}
			s.mu.Lock()
			s.count++
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *stream) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// finish stops the stream and returns its error and exchange count.
func (s *stream) finish() (int, error) {
	close(s.stop)
	<-s.done
	s.conn.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count, s.err
}

// progressing reports, per stream, an error unless it exchanged at least
// once during d (all watched over the same window, so a slow shared
// machine stretches one wait, not one per stream).
func progressing(streams []*stream, d time.Duration) []error {
	before := make([]int, len(streams))
	for i, s := range streams {
		s.mu.Lock()
		before[i] = s.count
		s.mu.Unlock()
	}
	time.Sleep(d)
	errs := make([]error, len(streams))
	for i, s := range streams {
		s.mu.Lock()
		switch {
		case s.err != nil:
			errs[i] = s.err
		case s.count == before[i]:
			errs[i] = fmt.Errorf("no exchange in %v", d)
		}
		s.mu.Unlock()
	}
	return errs
}

// checkLeaveJoin: node2 leaves the peers file, then rejoins. Its pods stop
// being reachable and come back; a connection between node0 and node1 is
// not disturbed by either change.
func checkLeaveJoin(t *testing.T, c *cluster) {
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	streams := []*stream{startStream(t, n0.pods[0].NS, n1.pods[0].addr(false)), startStream(t, n0.pods[0].NS, n1.pods[0].addr(true))}
	c.writePeers([]*node{n0, n1})
	for _, v6 := range []bool{false, true} {
		if err := eventually(5*time.Second, func() error {
			if _, err := dialName(n0.pods[0].NS, n2.pods[0].addr(v6), 500*time.Millisecond); err == nil {
				return fmt.Errorf("still reachable")
			}
			return nil
		}); err != nil {
			t.Errorf("after node2 left, pod on node0 -> pod on node2 (v6=%v): %v", v6, err)
		}
	}
	c.writePeers(c.nodes)
	for _, v6 := range []bool{false, true} {
		if err := eventually(10*time.Second, func() error {
			_, err := dialName(n0.pods[0].NS, n2.pods[0].addr(v6), time.Second)
			return err
		}); err != nil {
			t.Errorf("after node2 rejoined, pod on node0 -> pod on node2 (v6=%v): %v", v6, err)
		}
	}
	for i, s := range streams {
		if n, err := s.finish(); err != nil || n == 0 {
			t.Errorf("stream %d between unaffected nodes: %d exchanges, %v", i, n, err)
		}
	}
}

// checkRestart SIGKILLs the daemons of both ends of live cross-node
// connections, opens new connections while they are down, and restarts
// them: no connection may break.
func checkRestart(t *testing.T, c *cluster) {
	n0, n1 := c.nodes[0], c.nodes[1]
	var streams []*stream
	for _, v6 := range []bool{false, true} {
		streams = append(streams, startStream(t, n0.pods[0].NS, n1.pods[0].addr(v6)), startStream(t, n1.pods[0].NS, n0.pods[0].addr(v6)))
	}
	wgPIDs := []int{n0.wgPID(), n1.wgPID()}
	var wgLinks []int
	if c.mode.encryption == "wireguard" {
		wgLinks = []int{n0.wgLink(t).Attrs().Index, n1.wgLink(t).Attrs().Index}
	}
	for _, n := range []*node{n0, n1} {
		if err := n.StopDaemon(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	for i, err := range progressing(streams, 2*time.Second) {
		if err != nil {
			t.Errorf("stream %d with both daemons down: %v", i, err)
		}
	}
	for _, v6 := range []bool{false, true} {
		if _, err := dialName(n0.pods[0].NS, n1.pods[0].addr(v6), 2*time.Second); err != nil {
			t.Errorf("new connection while daemons are down (v6=%v): %v", v6, err)
		}
	}
	injectStale(t, n0, c.mode.v6Underlay)
	// Side by side, as nodes restart: each start loads the datapath,
	// which is most of the time in a qemu guest.
	var wg sync.WaitGroup
	starts := make([]error, 2)
	for i, n := range []*node{n0, n1} {
		wg.Add(1)
		go func() { defer wg.Done(); starts[i] = n.StartDaemon() }()
	}
	wg.Wait()
	for i, n := range []*node{n0, n1} {
		if starts[i] != nil {
			t.Fatalf("%s: %v", n.Name, starts[i])
		}
	}
	checkStaleGone(t, n0)
	for i, err := range progressing(streams, 2*time.Second) {
		if err != nil {
			t.Errorf("stream %d after restart: %v", i, err)
		}
	}
	for i, s := range streams {
		if n, err := s.finish(); err != nil {
			t.Errorf("stream %d: broke after %d exchanges: %v", i, n, err)
		}
	}
	if c.mode.encryption == "wireguard" {
		// The restarted daemons adopted the running devices: the same
		// link, and the same process for the userspace one.
		for i, n := range []*node{n0, n1} {
			if got := n.wgLink(t).Attrs().Index; got != wgLinks[i] {
				t.Errorf("%s: WireGuard device ifindex %d before the restart, %d after: re-created", n.Name, wgLinks[i], got)
			}
			c.requireDeviceKind(n)
			if c.mode.wgKind != wireguard.KindUserspace {
				continue
			}
			if got := n.wgPID(); got != wgPIDs[i] || got == 0 {
				t.Errorf("%s: userspace WireGuard PID %d before the restart, %d after", n.Name, wgPIDs[i], got)
			}
		}
	}
	checkReachability(t, c)
}

var (
	staleDst = netip.MustParsePrefix("10.99.0.0/24")
	staleMAC = net.HardwareAddr{0x02, 0, 0, 0, 0x99, 0x99}
)

// injectStale leaves what a previous run for a departed peer would have:
// a route with the daemon's protocol and, on the VXLAN device, an FDB and
// a neighbour entry.
func injectStale(t *testing.T, n *node, v6Underlay bool) {
	t.Helper()
	if err := n.NS.Do(func(ns.NetNS) error {
		rt := &netlink.Route{Dst: ipNet(staleDst), Gw: net.ParseIP("192.0.2.2"), Protocol: routing.RouteProtocol}
		if err := netlink.RouteAdd(rt); err != nil {
			return fmt.Errorf("stale route: %w", err)
		}
		l, err := netlink.LinkByName(routing.DefaultVXLANDevice)
		if err != nil {
			return nil // not vxlan mode
		}
		idx := l.Attrs().Index
		remote := net.ParseIP("192.0.2.99")
		if v6Underlay {
			remote = net.ParseIP("2001:db8::99")
		}
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF, IP: remote, HardwareAddr: staleMAC}); err != nil {
			return fmt.Errorf("stale fdb: %w", err)
		}
		return netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT, IP: net.ParseIP("fe80::99"), HardwareAddr: staleMAC})
	}); err != nil {
		t.Fatal(err)
	}
}

func checkStaleGone(t *testing.T, n *node) {
	t.Helper()
	if err := n.NS.Do(func(ns.NetNS) error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: ipNet(staleDst)}, netlink.RT_FILTER_DST)
		if err != nil {
			return err
		}
		if len(routes) > 0 {
			return fmt.Errorf("stale route %v survived the start-up reconcile", staleDst)
		}
		l, err := netlink.LinkByName(routing.DefaultVXLANDevice)
		if err != nil {
			return nil
		}
		for _, fam := range []int{unix.AF_BRIDGE, netlink.FAMILY_V6} {
			list, err := netlink.NeighList(l.Attrs().Index, fam)
			if err != nil {
				return err
			}
			for _, e := range list {
				if e.HardwareAddr.String() == staleMAC.String() {
					return fmt.Errorf("stale neighbour/FDB entry %v %v survived the start-up reconcile", e.IP, e.HardwareAddr)
				}
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// checkDeviceCrash kills node0's userspace WireGuard process: the daemon's
// supervisor starts a new one and reconfigures it, and pods reach each
// other again (new handshakes with the unchanged key).
func checkDeviceCrash(t *testing.T, c *cluster) {
	n0, n1 := c.nodes[0], c.nodes[1]
	old := n0.wgPID()
	if old == 0 {
		t.Fatal("no userspace WireGuard PID file")
	}
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, v6 := range []bool{false, true} {
		if err := eventually(15*time.Second, func() error {
			_, err := dialName(n0.pods[0].NS, n1.pods[0].addr(v6), time.Second)
			return err
		}); err != nil {
			t.Fatalf("after the device process was killed (v6=%v): %v", v6, err)
		}
	}
	if now := n0.wgPID(); now == 0 || now == old {
		t.Errorf("device process PID %d, before %d: not restarted", now, old)
	}
}

// checkEncryptionOff restarts node0 without encryption: the device, its
// process, the node-to-node steering and the blackholes of the earlier run
// must go, or node-to-node traffic would keep flowing into an orphaned
// tunnel.
func checkEncryptionOff(t *testing.T, c *cluster) {
	n0 := c.nodes[0]
	pid := n0.wgPID()
	if err := n0.StopDaemon(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for i, a := range n0.ExtraArgs {
		if a == "wireguard" && i > 0 && n0.ExtraArgs[i-1] == "--encryption" {
			n0.ExtraArgs[i] = "none"
		}
	}
	c.startDaemon(n0)
	if pid != 0 && unix.Kill(pid, 0) == nil {
		t.Errorf("userspace WireGuard process %d still running", pid)
	}
	if err := n0.NS.Do(func(ns.NetNS) error {
		if _, err := netlink.LinkByName(n0.wgDevice); err == nil {
			return fmt.Errorf("device %s still exists", n0.wgDevice)
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rules, err := netlink.RuleList(fam)
			if err != nil {
				return err
			}
			for _, r := range rules {
				if r.Table == wireguard.NodeTable {
					return fmt.Errorf("node-to-node rule still present: %v", r)
				}
			}
		}
		// Left behind, they would drop the blocks of a peer that leaves.
		holes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: routing.BlackholeProtocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		if len(holes) > 0 {
			return fmt.Errorf("%d blackhole routes of the encrypted run still present: %v", len(holes), holes)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// checkNameCollision starts a fourth node with node0's device name: the
// name's control socket answers, but for a device in another namespace,
// and the daemon must refuse rather than reconfigure node0's tunnel.
func checkNameCollision(t *testing.T, c *cluster) {
	n := c.addNode()
	for i, a := range n.ExtraArgs {
		if a == "--wireguard-device" {
			n.ExtraArgs[i+1] = c.nodes[0].wgDevice
		}
	}
	if err := n.StartDaemon(); err == nil {
		t.Fatal("daemon started with another namespace's WireGuard device name")
	}
	if !n.LogContains("another namespace uses the name") {
		t.Fatalf("no clear error; log:\n%s", n.LogTail(10))
	}
	if err := reach(c.nodes[1].pods[0].NS, c.nodes[0].pods[0], false); err != nil {
		t.Fatalf("node0's tunnel disturbed: %v", err)
	}
}

// checkFullSizeDatagrams sends UDP datagrams that fill the pod MTU exactly
// (no local fragmentation) across nodes: if the tunnel cannot carry a
// full-size pod packet, they are lost, whatever TCP's MSS would hide.
func checkFullSizeDatagrams(t *testing.T, c *cluster) {
	src, dst := c.nodes[0].pods[0], c.nodes[1].pods[0]
	mtu := 1500 - c.mode.overhead
	for _, v6 := range []bool{false, true} {
		stop, err := harness.ServeUDPEcho(dst.NS, dst.addr(v6), echoPort)
		if err != nil {
			t.Fatal(err)
		}
		size := mtu - 28
		if v6 {
			size = mtu - 48
		}
		conn, err := harness.DialFrom(src.NS, "udp", dst.addr(v6), echoPort, time.Second)
		if err != nil {
			stop()
			t.Fatal(err)
		}
		// DF on, path MTU cache ignored: a datagram the tunnel cannot
		// carry is dropped every time instead of being fragmented after
		// the first ICMP "too big".
		if err := probeMTU(conn, v6); err != nil {
			conn.Close()
			stop()
			t.Fatal(err)
		}
		payload := make([]byte, size)
		_, _ = rand.Read(payload)
		got := make([]byte, 2048)
		var n int
		err = eventually(3*time.Second, func() error {
			if _, err := conn.Write(payload); err != nil {
				return err
			}
			_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			var rerr error
			n, rerr = conn.Read(got)
			return rerr
		})
		conn.Close()
		stop()
		if err != nil || !bytes.Equal(got[:n], payload) {
			t.Errorf("v6=%v: %d-byte datagram (pod MTU %d) not echoed intact: %v", v6, size, mtu, err)
		}
	}
}

func probeMTU(conn net.Conn, v6 bool) error {
	raw, err := conn.(*net.UDPConn).SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_PROBE)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE)
		}
	}); err != nil {
		return err
	}
	return serr
}
