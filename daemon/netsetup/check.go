package netsetup

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	nsfile "github.com/coordino/coordino/daemon/netns"
)

// CheckPod verifies everything SetupPod configures for cfg and returns nil, or
// an error listing each problem precisely (which interface, address, route or
// neighbour entry is missing or wrong). The MTU is compared with cfg.MTU only
// when cfg.MTU is set; both ends must always agree.
func CheckPod(cfg PodConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if err := nsfile.Verify(cfg.NetNSPath); err != nil {
		return fmt.Errorf("check pod %s: %w", cfg.IfName, err)
	}
	nsf, err := os.Open(cfg.NetNSPath)
	if err != nil {
		return fmt.Errorf("check pod %s: open netns: %w", cfg.IfName, err)
	}
	defer nsf.Close()
	host, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("check pod %s: netlink socket in host netns: %w", cfg.IfName, err)
	}
	defer host.Close()
	pod, err := netlink.NewHandleAt(netns.NsHandle(nsf.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("check pod %s: netlink socket in netns %s: %w", cfg.IfName, cfg.NetNSPath, err)
	}
	defer pod.Close()

	c := checker{cfg: cfg, host: host, pod: pod}
	c.run()
	return errors.Join(c.problems...)
}

type checker struct {
	cfg       PodConfig
	host, pod *netlink.Handle
	problems  []error
}

func (c *checker) fail(format string, args ...any) {
	c.problems = append(c.problems, fmt.Errorf(format, args...))
}

func (c *checker) run() {
	cfg := c.cfg
	hostLink, err := c.host.LinkByName(cfg.HostIfName)
	if err != nil {
		if isNotFound(err) {
			c.fail("host veth %s missing", cfg.HostIfName)
		} else {
			c.fail("look up host veth %s: %v", cfg.HostIfName, err)
		}
	}
	podLink, err := c.pod.LinkByName(cfg.IfName)
	if err != nil {
		if isNotFound(err) {
			c.fail("pod interface %s missing in %s", cfg.IfName, cfg.NetNSPath)
		} else {
			c.fail("look up pod interface %s in %s: %v", cfg.IfName, cfg.NetNSPath, err)
		}
	}
	if lo, err := c.pod.LinkByIndex(loopbackIndex); err != nil {
		c.fail("look up lo in %s: %v", cfg.NetNSPath, err)
	} else if lo.Attrs().Flags&net.FlagUp == 0 {
		c.fail("lo in %s is down", cfg.NetNSPath)
	}
	if hostLink == nil || podLink == nil {
		return // the rest hangs off both links
	}

	h, p := hostLink.Attrs(), podLink.Attrs()
	switch {
	case hostLink.Type() != "veth":
		c.fail("host interface %s is a %s, not a veth", cfg.HostIfName, hostLink.Type())
		return
	case podLink.Type() != "veth":
		c.fail("pod interface %s in %s is a %s, not a veth", cfg.IfName, cfg.NetNSPath, podLink.Type())
		return
	case h.ParentIndex != p.Index || p.ParentIndex != h.Index:
		c.fail("pod interface %s in %s is not the peer of host veth %s", cfg.IfName, cfg.NetNSPath, cfg.HostIfName)
		return
	}
	if h.Flags&net.FlagUp == 0 {
		c.fail("host veth %s is down", cfg.HostIfName)
	}
	if p.Flags&net.FlagUp == 0 {
		c.fail("pod interface %s in %s is down", cfg.IfName, cfg.NetNSPath)
	}
	if h.MTU != p.MTU {
		c.fail("MTU differs: host veth %s has %d, pod interface %s has %d", cfg.HostIfName, h.MTU, cfg.IfName, p.MTU)
	} else if cfg.MTU != 0 && p.MTU != cfg.MTU {
		c.fail("MTU of %s and %s is %d, want %d", cfg.HostIfName, cfg.IfName, p.MTU, cfg.MTU)
	}

	c.checkPodAddrs(podLink)
	for _, gw := range gateways(cfg) {
		c.checkPodGateway(podLink, gw, h.HardwareAddr)
	}
	c.checkHost(hostLink, p.HardwareAddr)
}

func (c *checker) checkPodAddrs(link netlink.Link) {
	addrs, err := c.pod.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		c.fail("list addresses on %s in %s: %v", c.cfg.IfName, c.cfg.NetNSPath, err)
		return
	}
	have := map[netip.Prefix]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			bits, _ := a.Mask.Size()
			have[netip.PrefixFrom(ip.Unmap(), bits)] = true
		}
	}
	for _, p := range c.cfg.Addrs {
		if !have[p] {
			c.fail("address %s missing on %s in %s", p, c.cfg.IfName, c.cfg.NetNSPath)
		}
	}
}

func (c *checker) checkPodGateway(link netlink.Link, gw netip.Addr, hostMAC net.HardwareAddr) {
	where := fmt.Sprintf("on %s in %s", c.cfg.IfName, c.cfg.NetNSPath)
	routes, err := c.pod.RouteList(link, family(gw))
	if err != nil {
		c.fail("list routes %s: %v", where, err)
		return
	}
	if gw.Is4() && !hasRoute(routes, hostNet(gw), nil) {
		c.fail("route to gateway %s missing %s", gw, where)
	}
	if !hasRoute(routes, nil, gw.AsSlice()) {
		c.fail("default route via %s missing %s", gw, where)
	}
	neighs, err := c.pod.NeighList(link.Attrs().Index, family(gw))
	if err != nil {
		c.fail("list neighbours %s: %v", where, err)
		return
	}
	c.checkNeigh(neighs, gw, hostMAC, "neighbour", where)
}

func (c *checker) checkHost(link netlink.Link, podMAC net.HardwareAddr) {
	where := "on " + c.cfg.HostIfName
	var routes []netlink.Route
	var neighs []netlink.Neigh
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		r, err := c.host.RouteList(link, fam)
		if err != nil {
			c.fail("list host routes %s: %v", where, err)
			return
		}
		n, err := c.host.NeighList(link.Attrs().Index, fam)
		if err != nil {
			c.fail("list host neighbours %s: %v", where, err)
			return
		}
		routes, neighs = append(routes, r...), append(neighs, n...)
	}
	for _, p := range c.cfg.Addrs {
		if !hasRoute(routes, hostNet(p.Addr()), nil) {
			c.fail("host route to %s missing %s", p.Addr(), where)
		}
		c.checkNeigh(neighs, p.Addr(), podMAC, "host neighbour", where)
	}
}

func (c *checker) checkNeigh(neighs []netlink.Neigh, ip netip.Addr, mac net.HardwareAddr, what, where string) {
	for _, n := range neighs {
		if !n.IP.Equal(ip.AsSlice()) {
			continue
		}
		switch {
		case !bytes.Equal(n.HardwareAddr, mac):
			c.fail("%s %s has MAC %s, want %s %s", what, ip, n.HardwareAddr, mac, where)
		case n.State&netlink.NUD_PERMANENT == 0:
			c.fail("%s %s is not permanent (state %#x) %s", what, ip, n.State, where)
		}
		return
	}
	c.fail("%s %s -> %s missing %s", what, ip, mac, where)
}

// hasRoute reports whether routes holds a main-table route to dst (nil: the
// default route) via gw (nil: directly on-link, so dst must not be nil).
func hasRoute(routes []netlink.Route, dst *net.IPNet, gw net.IP) bool {
	for _, r := range routes {
		if r.Table != unix.RT_TABLE_MAIN {
			continue
		}
		if isDefault(dst) != isDefault(r.Dst) {
			continue
		}
		if !isDefault(dst) && (!r.Dst.IP.Equal(dst.IP) || r.Dst.Mask.String() != dst.Mask.String()) {
			continue
		}
		if (gw == nil) != (r.Gw == nil) || (gw != nil && !r.Gw.Equal(gw)) {
			continue
		}
		// IPv6 has no route scopes; the kernel reports every one as universe.
		if gw == nil && dst.IP.To4() != nil && r.Scope != netlink.SCOPE_LINK {
			continue
		}
		return true
	}
	return false
}

// isDefault copes with both spellings of a default route: nil, or the zero
// prefix that netlink v1.3 reports.
func isDefault(n *net.IPNet) bool {
	if n == nil {
		return true
	}
	ones, _ := n.Mask.Size()
	return ones == 0
}
