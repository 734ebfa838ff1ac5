package cluster

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/routing"
)

// WireGuardPort is the daemon's default --wireguard-port.
const WireGuardPort = 51871

// UnderlayCount is what an UnderlayWatch saw on one node's eth0 so far.
type UnderlayCount struct {
	// Cleartext frames carried an IPv4 packet from one pod range to
	// another unencapsulated: pod traffic the underlay can read.
	Cleartext uint64
	// WireGuard frames were UDP to or from WireGuardPort.
	WireGuard uint64
	// Sample is the first cleartext frame's addresses, for the message.
	Sample string
	// ClearFrom splits Cleartext by the worker whose pod range holds the
	// packet's source: the node that let it out unencrypted.
	ClearFrom map[string]uint64
}

// UnderlayWatch reads every frame, both directions, of each worker's
// underlay interface (eth0 in its namespace) through an AF_PACKET socket
// bound to it, and counts pod-to-pod frames in the clear and WireGuard
// frames: the proof that cross-node pod traffic stays encrypted while the
// daemons are replaced.
type UnderlayWatch struct {
	mu     sync.Mutex
	counts map[string]*UnderlayCount
	fds    []int
	done   sync.WaitGroup
}

// WatchUnderlay starts an UnderlayWatch on every worker; Stop ends it.
func (c *Cluster) WatchUnderlay() (*UnderlayWatch, error) {
	w := &UnderlayWatch{counts: map[string]*UnderlayCount{}}
	pods := make([]netip.Prefix, len(c.workers))
	names := make([]string, len(c.workers))
	for i, m := range c.workers {
		pods[i], names[i] = workerPodCIDR(i+1), m.name
	}
	for _, m := range c.workers {
		var fd int
		err := inNetns(m.ns, func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
			if err != nil {
				return err
			}
			if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index}); err != nil {
				unix.Close(fd)
				return err
			}
			return nil
		})
		if err != nil {
			w.Stop()
			return nil, fmt.Errorf("capture on %s eth0: %w", m.name, err)
		}
		// Bursts of GSO frames must not overflow the default buffer.
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
		tv := unix.Timeval{Usec: 200000}
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		cnt := &UnderlayCount{ClearFrom: map[string]uint64{}}
		w.counts[m.name] = cnt
		w.fds = append(w.fds, fd)
		w.done.Add(1)
		go w.read(fd, cnt, pods, names)
	}
	return w, nil
}

func (w *UnderlayWatch) read(fd int, cnt *UnderlayCount, pods []netip.Prefix, names []string) {
	defer w.done.Done()
	buf := make([]byte, 256) // headers are enough; the rest is truncated
	for {
		n, _, err := unix.Recvfrom(fd, buf, unix.MSG_TRUNC)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			return // closed by Stop
		}
		if n > len(buf) {
			n = len(buf)
		}
		kind, sample, from := classifyFrame(buf[:n], pods)
		w.mu.Lock()
		switch kind {
		case frameCleartext:
			if cnt.Cleartext == 0 {
				cnt.Sample = sample
			}
			cnt.Cleartext++
			cnt.ClearFrom[names[from]]++
		case frameWireGuard:
			cnt.WireGuard++
		}
		w.mu.Unlock()
	}
}

// Counts returns a copy of the counts so far, by node.
func (w *UnderlayWatch) Counts() map[string]UnderlayCount {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]UnderlayCount{}
	for n, c := range w.counts {
		cp := *c
		cp.ClearFrom = maps.Clone(c.ClearFrom)
		out[n] = cp
	}
	return out
}

// Stop closes the sockets and waits for the readers.
func (w *UnderlayWatch) Stop() {
	for _, fd := range w.fds {
		// shutdown wakes a reader blocked in recvfrom; close alone may not.
		_ = unix.Shutdown(fd, unix.SHUT_RDWR)
		unix.Close(fd)
	}
	w.fds = nil
	w.done.Wait()
}

type frameKind int

const (
	frameOther frameKind = iota
	frameCleartext
	frameWireGuard
)

// classifyFrame sorts an Ethernet frame (802.1Q tags skipped): IPv4 from
// one of pods to one of pods, bare or in VXLAN, is cleartext pod traffic;
// UDP to or from WireGuardPort is WireGuard. sample names a cleartext
// packet's ends, from the index in pods of its source's range.
func classifyFrame(f []byte, pods []netip.Prefix) (kind frameKind, sample string, from int) {
	if len(f) < 14 {
		return frameOther, "", 0
	}
	etype, off := binary.BigEndian.Uint16(f[12:14]), 14
	for etype == 0x8100 && len(f) >= off+4 {
		etype, off = binary.BigEndian.Uint16(f[off+2:off+4]), off+4
	}
	if etype != 0x0800 || len(f) < off+20 || f[off]>>4 != 4 {
		return frameOther, "", 0
	}
	ip := f[off:]
	ihl := int(ip[0]&0x0f) * 4
	proto := ip[9]
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	if proto == unix.IPPROTO_UDP && ihl >= 20 && len(ip) >= ihl+4 {
		sp, dp := binary.BigEndian.Uint16(ip[ihl:]), binary.BigEndian.Uint16(ip[ihl+2:])
		if sp == WireGuardPort || dp == WireGuardPort {
			return frameWireGuard, "", 0
		}
		// VXLAN carries pods' packets readable too: look inside.
		if dp == routing.DefaultVXLANPort && len(ip) >= ihl+16 {
			return classifyFrame(ip[ihl+16:], pods)
		}
	}
	if i := indexOf(src, pods); i >= 0 && indexOf(dst, pods) >= 0 {
		return frameCleartext, fmt.Sprintf("%s -> %s proto %d", src, dst, proto), i
	}
	return frameOther, "", 0
}

func indexOf(a netip.Addr, ps []netip.Prefix) int {
	for i, p := range ps {
		if p.Contains(a) {
			return i
		}
	}
	return -1
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// WireGuardDevice is the daemon's default --wireguard-device.
const WireGuardDevice = "coordino-wg"

// wireGuardUserspace checks that node has the daemon's WireGuard device
// and that it is the userspace process's TUN and not down.
func (c *Cluster) wireGuardUserspace(node string) error {
	m := c.worker(node)
	if m == nil {
		return fmt.Errorf("no worker %q", node)
	}
	return inNetns(m.ns, func() error {
		l, err := netlink.LinkByName(WireGuardDevice)
		if err != nil {
			return fmt.Errorf("%s: WireGuard device %s: %w", node, WireGuardDevice, err)
		}
		if l.Type() != "tuntap" {
			return fmt.Errorf("%s: WireGuard device %s is a %q link, want the userspace device's tuntap", node, WireGuardDevice, l.Type())
		}
		if l.Attrs().OperState == netlink.OperDown {
			return fmt.Errorf("%s: WireGuard device %s is down", node, WireGuardDevice)
		}
		return nil
	})
}
