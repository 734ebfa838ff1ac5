package harness

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Pod is a network namespace standing in for a pod sandbox.
type Pod struct {
	Name        string
	ContainerID string
	NS          ns.NetNS
}

// NewPod creates a pod netns with lo up, as runtimes do before calling CNI.
func NewPod(name string) (*Pod, error) {
	podNS, err := testutils.NewNS()
	if err != nil {
		return nil, fmt.Errorf("create pod netns: %w", err)
	}
	p := &Pod{Name: name, ContainerID: "c" + RandomSuffix(31), NS: podNS}
	if err := podNS.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close removes the pod netns (a pinned copy stays alive until DEL).
func (p *Pod) Close() {
	if p.NS != nil {
		removeNS(p.NS)
		p.NS = nil
	}
}

// removeNS closes n and deletes its /run/netns file. The unmount is lazy:
// a child being forked meanwhile (os/exec in another goroutine, e.g. a
// daemon restart) holds a copy of n's fd until it execs, and a plain
// unmount (testutils.UnmountNS) then fails with EBUSY and leaves the
// namespace mounted for good.
func removeNS(n ns.NetNS) {
	_ = n.Close()
	_ = unix.Unmount(n.Path(), unix.MNT_DETACH)
	_ = os.Remove(n.Path())
}

// Serve accepts TCP connections on addr:port inside the netns and answers
// each with the server's name. It returns a stop function.
func Serve(netns ns.NetNS, addr netip.Addr, port int, name string) (stop func(), err error) {
	var l net.Listener
	if err := netns.Do(func(ns.NetNS) error {
		var lerr error
		l, lerr = net.Listen("tcp", netip.AddrPortFrom(addr, uint16(port)).String())
		return lerr
	}); err != nil {
		return nil, fmt.Errorf("listen on %v:%d: %w", addr, port, err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(name))
			c.Close()
		}
	}()
	return func() { l.Close() }, nil
}

// Dial connects from inside netns to addr:port and returns what the server said.
func Dial(netns ns.NetNS, addr netip.Addr, port int) (string, error) {
	var got string
	err := netns.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(addr, uint16(port)).String(), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 256)
		n, err := c.Read(buf)
		if err != nil && !errors.Is(err, net.ErrClosed) && n == 0 {
			return err
		}
		got = string(buf[:n])
		return nil
	})
	return got, err
}
