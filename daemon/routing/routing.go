package routing

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"

	"github.com/coordino/coordino/daemon/peers"
)

// Modes of --routing.
const (
	Direct = "direct"
	VXLAN  = "vxlan"
)

// Per-packet overheads the pod MTU gives up: outer IP + UDP + VXLAN +
// inner Ethernet; WireGuard's outer IPv6 + UDP + header + tag (the IPv6
// figure is used for both families so a node can gain an IPv6 underlay
// without re-creating pods).
const (
	VXLANOverheadIPv4 = 50
	VXLANOverheadIPv6 = 70
	WireGuardOverhead = 80
)

// Defaults for the VXLAN device. The VNI is fixed: it does not carry the
// source identity (see docs/architecture.md, Multi-node).
const (
	DefaultVXLANDevice = "coordino-vxlan"
	DefaultVXLANPort   = 8472
	DefaultVNI         = 1
)

// RouteProtocol marks every route this package installs (rtm_protocol), so
// a reconcile finds its own routes, and only those, after a restart.
const RouteProtocol = 0xc5

// Config configures a Router.
type Config struct {
	// Mode is Direct or VXLAN; ignored when Device is set.
	Mode string
	// Self is this node's name: its entry in the peer set is skipped.
	Self string
	// Device, when set, routes every peer block onto that interface (the
	// WireGuard device) instead of via the peer's address.
	Device string
	// UnderlayMTU is the MTU of the node's uplink (VXLAN device MTU is
	// this minus the encapsulation).
	UnderlayMTU int
	// VXLANDevice, VXLANPort and VNI shape the VXLAN device.
	VXLANDevice string
	VXLANPort   int
	VNI         int
}

func (c *Config) defaults() {
	if c.VXLANDevice == "" {
		c.VXLANDevice = DefaultVXLANDevice
	}
	if c.VXLANPort == 0 {
		c.VXLANPort = DefaultVXLANPort
	}
	if c.VNI == 0 {
		c.VNI = DefaultVNI
	}
	if c.UnderlayMTU == 0 {
		c.UnderlayMTU = 1500
	}
}

// Validate checks the mode.
func (c *Config) Validate() error {
	if c.Device == "" && c.Mode != Direct && c.Mode != VXLAN {
		return fmt.Errorf("routing %q: want direct or vxlan", c.Mode)
	}
	if c.VNI < 0 || c.VNI >= 1<<24 {
		return fmt.Errorf("vni %d: want 1..16777215", c.VNI)
	}
	return nil
}

// PodMTUOverhead is what the pod MTU gives up for the cross-node path:
// the VXLAN encapsulation of the underlay family, or WireGuard's.
func PodMTUOverhead(mode string, encrypted, underlayV6 bool) int {
	switch {
	case encrypted:
		return WireGuardOverhead
	case mode == VXLAN && underlayV6:
		return VXLANOverheadIPv6
	case mode == VXLAN:
		return VXLANOverheadIPv4
	}
	return 0
}

// UnderlayIsV6 reports whether the VXLAN underlay of self is IPv6: only
// when the node has no IPv4 address at all.
func UnderlayIsV6(self *peers.Node) bool {
	if self == nil {
		return false
	}
	_, v4 := self.Address(false)
	_, v6 := self.Address(true)
	return !v4 && v6
}

// VTEP is where a node's VXLAN device is reached: its underlay address
// and the device's MAC (what every peer's FDB and neighbour entries hold).
type VTEP struct {
	Addr netip.Addr
	MAC  net.HardwareAddr
}

// VTEPOf returns p's VTEP on an underlay of the given family.
func VTEPOf(p *peers.Node, underlayV6 bool) (VTEP, bool) {
	a, ok := p.Address(underlayV6)
	if !ok {
		return VTEP{}, false
	}
	return VTEP{Addr: a, MAC: vtepMAC(p.Name)}, true
}

// vtepMAC is a node's VXLAN device MAC, derived from its name so every
// node computes its peers' MACs without publishing them: locally
// administered, unicast.
func vtepMAC(node string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("coordino-vtep/" + node))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// vtepLinkLocal is the next hop for all of a peer's blocks on the VXLAN
// device (IPv4 ones through RTA_VIA): the EUI-64 link-local address of its
// VTEP MAC, which needs no address plan and exists whatever the underlay
// family.
func vtepLinkLocal(mac net.HardwareAddr) netip.Addr {
	var b [16]byte
	b[0], b[1] = 0xfe, 0x80
	b[8], b[9], b[10] = mac[0]^0x02, mac[1], mac[2]
	b[11], b[12] = 0xff, 0xfe
	b[13], b[14], b[15] = mac[3], mac[4], mac[5]
	return netip.AddrFrom16(b)
}
