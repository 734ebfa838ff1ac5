package cluster

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Address plan. The underlay and pod ranges are checked against the host's
// routes before anything is created; the service range exists only inside
// the node namespaces (kube-proxy's rules). It is not Kubernetes' usual
// 10.96.0.0/12, so every bed run shows that Coordino takes it from the
// API (ServiceCIDR objects) and hard-codes none.
const (
	UnderlayCIDR = "10.233.0.0/24"
	PodCIDR      = "10.234.0.0/16"
	ServiceCIDR  = "10.112.0.0/16"
	DNSServiceIP = "10.112.0.10"
	ClusterDNS   = "cluster.local"
)

var (
	hostUnderlayIP = netip.MustParseAddr("10.233.0.254")
	controlPlaneIP = netip.MustParseAddr("10.233.0.2")
	// OutsideIP is the outside host's underlay address: a namespace on
	// the underlay that is no node and has no route to the pod ranges, as
	// a package mirror or a database VM beside the nodes would be.
	OutsideIP = netip.MustParseAddr("10.233.0.200")
)

// kubernetesServiceIP is the kubernetes Service's address: the first of
// the Service range (the API server's certificate names it).
func kubernetesServiceIP() netip.Addr {
	return netip.MustParsePrefix(ServiceCIDR).Addr().Next()
}

// workerIP is worker i's (1-based) underlay address: 10.233.<rack>.1<i>,
// rack 0 unless the bed has racks (Routing bgp).
func (c *Cluster) workerIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 233, byte(c.rackOf(i)), byte(10 + i)})
}

// workerPodCIDR is the IPPool of worker i: one /24 per node, so the control
// plane's routes back to pods (API server replies) are static.
func workerPodCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 234, byte(i), 0}), 24)
}

// inNetns runs fn on a thread switched into ns, and puts the thread back.
func inNetns(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return err
	}
	defer func() { _ = netns.Set(orig) }()
	return fn()
}

// newNamedNetns creates /run/netns/name without moving the caller's thread.
func newNamedNetns(name string) (netns.NsHandle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return 0, err
	}
	defer orig.Close()
	defer func() { _ = netns.Set(orig) }() // the locked thread dies with a failure
	h, err := netns.NewNamed(name)
	if err != nil {
		return 0, fmt.Errorf("create netns %s: %w", name, err)
	}
	return h, nil
}

// underlay is the bridge namespace and the machines' attachments to it.
type underlay struct {
	ns     netns.NsHandle
	bridge string
}

func newUnderlay(name string) (*underlay, error) {
	h, err := newNamedNetns(name)
	if err != nil {
		return nil, err
	}
	u := &underlay{ns: h, bridge: "br0"}
	return u, u.addBridge(u.bridge)
}

// addBridge adds one more segment (a rack) to the underlay namespace.
func (u *underlay) addBridge(name string) error {
	return inNetns(u.ns, func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("add underlay bridge %s: %w", name, err)
		}
		return netlink.LinkSetUp(br)
	})
}

// attach connects a namespace (or the host when target is the host's
// handle) to the bridge: a veth whose peer in the target is named ifName
// and carries addr in the underlay prefix.
func (u *underlay) attach(portName string, target netns.NsHandle, ifName string, addr netip.Addr) error {
	return u.attachTo(u.bridge, portName, target, ifName, addr)
}

// attachTo is attach to one of the underlay's bridges (every segment is a
// /24, as UnderlayCIDR).
func (u *underlay) attachTo(bridge, portName string, target netns.NsHandle, ifName string, addr netip.Addr) error {
	bits := netip.MustParsePrefix(UnderlayCIDR).Bits()
	err := inNetns(u.ns, func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: portName}, PeerName: ifName, PeerNamespace: netlink.NsFd(int(target))}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s: %w", portName, err)
		}
		br, err := netlink.LinkByName(bridge)
		if err != nil {
			return err
		}
		port, err := netlink.LinkByName(portName)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(port, br); err != nil {
			return err
		}
		return netlink.LinkSetUp(port)
	})
	if err != nil {
		return err
	}
	return inNetns(target, func() error {
		l, err := netlink.LinkByName(ifName)
		if err != nil {
			return err
		}
		ipn := &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(bits, 32)}
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil {
			return fmt.Errorf("address %s on %s: %w", addr, ifName, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
}

// addDefaultRoute routes everything else of ns to gw.
func addDefaultRoute(ns netns.NsHandle, gw netip.Addr) error {
	return addRoute(ns, netip.MustParsePrefix("0.0.0.0/0"), gw)
}

// addRoute adds dst via gw in ns.
func addRoute(ns netns.NsHandle, dst netip.Prefix, gw netip.Addr) error {
	return inNetns(ns, func() error {
		ipn := &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)}
		if err := netlink.RouteAdd(&netlink.Route{Dst: ipn, Gw: gw.AsSlice()}); err != nil {
			return fmt.Errorf("route %s via %s: %w", dst, gw, err)
		}
		return nil
	})
}

// setSysctl writes a /proc/sys value inside ns (the net.* tree is per
// namespace).
func setSysctl(ns netns.NsHandle, key, value string) error {
	return inNetns(ns, func() error { return writeProcSys(key, value) })
}

func writeProcSys(key, value string) error {
	return os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644)
}

// NodeIP is a worker's underlay address (where its kubelet, kube-proxy and
// host-network pods such as Coordino's daemon listen).
func (c *Cluster) NodeIP(node string) (netip.Addr, error) {
	for i, n := range c.Nodes {
		if n == node {
			return c.workerIP(i + 1), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no worker %q", node)
}
