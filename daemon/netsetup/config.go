package netsetup

import (
	"crypto/rand"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// GatewayV4 is the pod's IPv4 next hop: link-local, never on the wire, and
// resolved by a permanent neighbour entry to the host veth's MAC.
var GatewayV4 = netip.MustParseAddr("169.254.1.1")

// GatewayV6 is the pod's IPv6 next hop, resolved like GatewayV4.
var GatewayV6 = netip.MustParseAddr("fe80::1")

// minMTU is the IPv4 minimum; IPv6 pods additionally need 1280.
const (
	minMTU   = 68
	minMTUv6 = 1280
	maxMTU   = 65535
)

// PodConfig describes one pod interface for SetupPod and CheckPod.
type PodConfig struct {
	NetNSPath  string         // pod network namespace (the daemon passes the pinned path)
	IfName     string         // pod-side interface name (CNI_IFNAME)
	HostIfName string         // host-side veth name, normally from HostIfName
	MTU        int            // 0 means DefaultMTU()
	Addrs      []netip.Prefix // pod addresses: IPv4 as /32, IPv6 as /128; dual-stack allowed
	// WhileConfiguring, if set, runs as soon as the veth pair exists, given
	// the host end's ifindex and both ends' MACs, side by side with the configuration of both
	// ends; SetupPod waits for it and fails with its error. The datapath
	// attach goes here: its waits for the kernel's RCU grace periods then
	// overlap the netlink work. It runs on another goroutine, so in the
	// process's network namespace, not in one the caller's thread entered.
	// CheckPod ignores it.
	WhileConfiguring func(hostIfIndex int, hostMAC, podMAC net.HardwareAddr) error
}

// Attachment is what SetupPod created, as the CNI result needs it.
type Attachment struct {
	HostIfName  string           // host-side veth name
	HostIfIndex int              // host-side ifindex, in the host netns
	HostMAC     net.HardwareAddr // also the MAC the pod's gateways resolve to
	PodIfIndex  int              // pod-side ifindex, in the pod netns
	PodMAC      net.HardwareAddr // also the MAC the host's pod neighbours resolve to
	MTU         int              // MTU applied to both ends
}

// validate returns an error naming the first field of c that SetupPod or
// CheckPod cannot use.
func (c *PodConfig) validate() error {
	if c.NetNSPath == "" {
		return fmt.Errorf("pod config: NetNSPath is empty")
	}
	if err := validIfName("pod config: IfName", c.IfName); err != nil {
		return err
	}
	if err := validIfName("pod config: HostIfName", c.HostIfName); err != nil {
		return err
	}
	if !strings.HasPrefix(c.HostIfName, HostIfPrefix) {
		return fmt.Errorf("pod config: HostIfName %q does not start with %q", c.HostIfName, HostIfPrefix)
	}
	if len(c.Addrs) == 0 {
		return fmt.Errorf("pod config: Addrs is empty")
	}
	seen := make(map[netip.Addr]bool, len(c.Addrs))
	for _, p := range c.Addrs {
		a := p.Addr()
		switch {
		case !p.IsValid():
			return fmt.Errorf("pod config: Addrs contains an invalid prefix")
		case a.Zone() != "":
			return fmt.Errorf("pod config: address %s has a zone", p)
		case a.Is4In6():
			return fmt.Errorf("pod config: address %s is IPv4-mapped IPv6; give it as IPv4", p)
		case p.Bits() != a.BitLen():
			return fmt.Errorf("pod config: address %s must be a /%d", p, a.BitLen())
		case a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast():
			return fmt.Errorf("pod config: address %s is not a usable unicast pod address", p)
		case seen[a]:
			return fmt.Errorf("pod config: address %s is listed twice", p)
		}
		seen[a] = true
	}
	if c.MTU != 0 {
		low := minMTU
		if c.hasV6() {
			low = minMTUv6
		}
		if c.MTU < low || c.MTU > maxMTU {
			return fmt.Errorf("pod config: MTU %d is outside %d..%d", c.MTU, low, maxMTU)
		}
	}
	return nil
}

func (c *PodConfig) hasV4() bool {
	for _, p := range c.Addrs {
		if p.Addr().Is4() {
			return true
		}
	}
	return false
}

func (c *PodConfig) hasV6() bool {
	for _, p := range c.Addrs {
		if p.Addr().Is6() {
			return true
		}
	}
	return false
}

// randomMAC returns a random locally administered unicast MAC.
func randomMAC() net.HardwareAddr {
	mac := make(net.HardwareAddr, 6)
	rand.Read(mac) // never fails (crypto/rand panics instead, per its contract)
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func hostNet(a netip.Addr) *net.IPNet {
	return ipNet(netip.PrefixFrom(a, a.BitLen()))
}
