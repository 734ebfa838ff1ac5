package datapath

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/coordino/coordino/bpf"
)

// Tunnel configures the eBPF VXLAN tunnel (bpf/lib/tunnel.h): host-routed
// pod packets to and from other nodes' blocks are encapsulated and
// decapsulated by the programs, in the VXLAN device's wire format, instead
// of by the device. IPv4 underlays only.
type Tunnel struct {
	// Self is this node's VTEP: the outer source, and the only destination
	// decapsulated; its MAC is the inner frames' source.
	Self TunnelEndpoint
	// Port and VNI are the VXLAN device's.
	Port uint16
	VNI  uint32
	// Peers maps every other node's block to that node's VTEP.
	Peers map[netip.Prefix]TunnelEndpoint
}

// TunnelEndpoint is a node's VTEP: its IPv4 underlay address and its VXLAN
// device's MAC.
type TunnelEndpoint struct {
	Addr netip.Addr
	MAC  net.HardwareAddr
}

// tunnelOn and tunnelGuard are TUNNEL_ON and TUNNEL_GUARD of bpf/coordino.h.
const (
	tunnelOn    = 1
	tunnelGuard = 2
)

// SetTunnel turns the eBPF tunnel on with t, or off (nil). Turning on
// writes the peers before the switch, turning off flips the switch first,
// so no packet is encapsulated towards a VTEP the map does not hold yet.
func (d *Datapath) SetTunnel(t *Tunnel) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hr.setTunnel(t)
}

func (h *hostRouting) setTunnel(t *Tunnel) error {
	if t == nil {
		c := h.tunnelCfg
		c.Flags &^= tunnelOn
		c.Src, c.Mac, c.Vni = 0, [6]uint8{}, 0
		if c.Flags&tunnelGuard == 0 {
			c.Port = 0
		}
		if err := h.writeTunnelConfig(c); err != nil {
			return fmt.Errorf("datapath: turn the eBPF tunnel off: %w", err)
		}
		if err := syncBlocks(h.health, h.maps.tunnelPeers, bpf.CoordinoMapCdoTunnelPeers, &h.tunnelPeers, nil); err != nil {
			return fmt.Errorf("datapath: tunnel peers: %w", err)
		}
		return nil
	}
	self, err := t.Self.vtep()
	if err != nil {
		return fmt.Errorf("datapath: eBPF tunnel: this node: %w", err)
	}
	want := make(map[bpf.CoordinoIpcacheKey]bpf.CoordinoTunnelPeer, len(t.Peers))
	for block, e := range t.Peers {
		v, err := e.vtep()
		if err != nil {
			return fmt.Errorf("datapath: eBPF tunnel: block %s: %w", block, err)
		}
		want[ipcacheKey(block)] = v
	}
	// With a peer missing or stale the tunnel is not turned on: the caller
	// turns it off, and the VXLAN device carries everything.
	if err := syncBlocks(h.health, h.maps.tunnelPeers, bpf.CoordinoMapCdoTunnelPeers, &h.tunnelPeers, want); err != nil {
		return fmt.Errorf("datapath: tunnel peers: %w", err)
	}
	c := h.tunnelCfg
	c.Flags |= tunnelOn
	c.Vni, c.Src, c.Port, c.Mac = t.VNI, self.Vtep, htons(t.Port), self.Mac
	if err := h.writeTunnelConfig(c); err != nil {
		return fmt.Errorf("datapath: turn the eBPF tunnel on: %w", err)
	}
	return nil
}

// SetVXLANGuard guards the VXLAN device's UDP port (0: off): pods may not
// send to it at any node address, and this node accepts it from peer
// nodes only (bpf/lib/tunnel.h). Independent of the eBPF tunnel.
func (d *Datapath) SetVXLANGuard(port uint16) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hr.setVXLANGuard(port)
}

func (h *hostRouting) setVXLANGuard(port uint16) error {
	c := h.tunnelCfg
	if port == 0 {
		c.Flags &^= tunnelGuard
		if c.Flags&tunnelOn == 0 {
			c.Port = 0
		}
	} else {
		c.Flags |= tunnelGuard
		c.Port = htons(port)
	}
	if err := h.writeTunnelConfig(c); err != nil {
		return fmt.Errorf("datapath: VXLAN guard: %w", err)
	}
	return nil
}

// writeTunnelConfig writes cdo_tunnel.
func (h *hostRouting) writeTunnelConfig(c bpf.CoordinoTunnelConfig) error {
	if c == h.tunnelCfg {
		return nil
	}
	if err := h.maps.tunnel.Put(uint32(0), c); err != nil {
		return err
	}
	h.tunnelCfg = c
	return nil
}

// vtep is e in the programs' layout (address in network order).
func (e TunnelEndpoint) vtep() (bpf.CoordinoTunnelPeer, error) {
	var v bpf.CoordinoTunnelPeer
	if !e.Addr.Unmap().Is4() {
		return v, fmt.Errorf("VTEP %s: want an IPv4 address", e.Addr)
	}
	if len(e.MAC) != 6 {
		return v, fmt.Errorf("VTEP %s: MAC %q is not 6 bytes", e.Addr, e.MAC)
	}
	a := e.Addr.Unmap().As4()
	v.Vtep = binary.NativeEndian.Uint32(a[:])
	copy(v.Mac[:], e.MAC)
	return v, nil
}
