package daemon

import (
	"net/netip"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/routing"
)

// eBPF host routing (--host-routing=bpf, daemon/datapath/hostroute.go) is
// fed from the same peer sets as node isolation: the other nodes' blocks
// are what pods reach, and are reached from, past the host's forwarding
// path. Under WireGuard no block is fed, so everything keeps the normal
// path: the tunnel device is an L3 device and its cost dwarfs forwarding.

func (n *nodePeers) hostRouting() bool {
	return n.o.HostRouting == "bpf" && n.o.Encryption != "wireguard"
}

// applyHostRouting writes the flag and the peer blocks; callers hold mu.
func (n *nodePeers) applyHostRouting() {
	on, err := n.dp.SetHostRouting(n.hostRouting())
	if err != nil {
		n.log.Error("host routing: set mode", zap.Error(err))
	}
	var blocks []netip.Prefix
	if on {
		for name, p := range n.last {
			if name != n.o.NodeName {
				blocks = append(blocks, p.Blocks...)
			}
		}
	}
	if err := n.dp.SetPeerBlocks(blocks); err != nil {
		n.log.Error("host routing: peer blocks", zap.Error(err))
	}
	var tunnel *datapath.Tunnel
	if on && n.o.Routing == routing.VXLAN {
		tunnel = n.tunnel()
	}
	if err := n.dp.SetTunnel(tunnel); err != nil {
		// A peer left half written could be encapsulated to a stale VTEP:
		// the device, whose entries are the router's, carries everything.
		n.log.Error("host routing: eBPF tunnel; turning it off", zap.Error(err))
		if tunnel != nil {
			if err := n.dp.SetTunnel(nil); err != nil {
				n.log.Error("host routing: turn the eBPF tunnel off", zap.Error(err))
			}
		}
	}
}

// tunnel is the eBPF VXLAN tunnel's configuration for the last peer set:
// the VXLAN device's VTEPs, port and VNI. nil (the device carries
// everything) on an IPv6 underlay or while this node has no IPv4 address
// in the set. Callers hold mu.
func (n *nodePeers) tunnel() *datapath.Tunnel {
	self := n.last[n.o.NodeName]
	if self == nil || routing.UnderlayIsV6(self) {
		return nil
	}
	v, ok := routing.VTEPOf(self, false)
	if !ok {
		return nil
	}
	t := &datapath.Tunnel{
		Self: datapath.TunnelEndpoint(v), Port: routing.DefaultVXLANPort, VNI: routing.DefaultVNI,
		Peers: map[netip.Prefix]datapath.TunnelEndpoint{},
	}
	for name, p := range n.last {
		if name == n.o.NodeName {
			continue
		}
		// A peer without an IPv4 address has no FDB entry either.
		if pv, ok := routing.VTEPOf(p, false); ok {
			for _, b := range p.Blocks {
				t.Peers[b] = datapath.TunnelEndpoint(pv)
			}
		}
	}
	return t
}

// attachTunnel puts host routing's ingress on the VXLAN device, where
// other nodes' pod packets arrive decapsulated, and returns the device
// whose tunnel hook stays ("": none); callers hold mu.
func (n *nodePeers) attachTunnel() string {
	if !n.hostRouting() || n.o.Routing != routing.VXLAN {
		return ""
	}
	l, err := netlink.LinkByName(routing.DefaultVXLANDevice)
	if err != nil {
		return routing.DefaultVXLANDevice // not created yet: the next periodic check attaches
	}
	if err := n.dp.AttachTunnelDevice(l.Attrs().Name, l.Attrs().Index); err != nil {
		n.log.Error("host routing: attach to the VXLAN device", zap.Error(err))
	}
	return l.Attrs().Name
}
