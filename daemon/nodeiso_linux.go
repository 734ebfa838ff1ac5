package daemon

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/nftdp"
	"github.com/coordino/coordino/daemon/peers"
	"github.com/coordino/coordino/daemon/routing"
)

// nodePeers hands the peer set to node isolation: the cross-node datapath
// starts (and publishes its first set) before the datapath exists, so the
// latest set is kept until bind. Each set gives the other nodes' addresses
// the remote-node identity and, in eBPF mode, (re)attaches the
// node-to-node programs to the underlay and tunnel devices (nftables
// judges other nodes' traffic in its input hook, whatever the device).
type nodePeers struct {
	o   *config.Options
	log *zap.Logger

	mu   sync.Mutex
	last peers.Set
	dp   *datapath.Datapath
	// iso is the datapath enforcing node isolation: dp, or the nftables
	// datapath.
	iso nodeIsoSink
	// prunedFor is the tunnel device whose hook the last pruning of device
	// hooks kept (nil: not pruned yet). Pruning lists every pinned link, so
	// it runs at start and when that device changes, not on every check.
	prunedFor *string
}

// nodeIsoSink is what both datapaths take of node isolation's inputs.
type nodeIsoSink interface {
	SetRemoteNodeIPs(ips []netip.Addr) error
	SetTunnelPorts(ports []uint16) error
}

func newNodePeers(o *config.Options, log *zap.Logger) *nodePeers {
	return &nodePeers{o: o, log: log.Named("nodeiso")}
}

// publish is the cross-node datapath's peers callback.
func (n *nodePeers) publish(s peers.Set) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.last = s
	n.applyLocked()
}

// reattachInterval bounds how long a re-created node device (a restarted
// userspace WireGuard process brings a new TUN) runs without the
// node-to-node programs.
const reattachInterval = 2 * time.Second

// bind starts feeding dp (nil with --no-datapath: nothing to do) until ctx
// ends, re-checking the attachments periodically.
func (n *nodePeers) bind(ctx context.Context, dp *datapath.Datapath) {
	if dp == nil {
		return
	}
	go func() {
		t := time.NewTicker(reattachInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				n.mu.Lock()
				n.attachDevices()
				n.mu.Unlock()
			}
		}
	}()
	n.mu.Lock()
	defer n.mu.Unlock()
	n.dp = dp
	n.setSink(dp)
	var guard uint16
	if n.o.Routing == routing.VXLAN && n.o.Encryption != "wireguard" {
		guard = routing.DefaultVXLANPort
	}
	if err := dp.SetVXLANGuard(guard); err != nil {
		n.log.Error("VXLAN guard", zap.Error(err))
	}
	if !n.hostRouting() {
		n.applyHostRouting() // a previous run's pinned flag and blocks go now, peers or not
	}
	n.applyLocked()
}

// bindNFTables starts feeding the nftables datapath (nil in eBPF mode).
func (n *nodePeers) bindNFTables(dp *nftdp.Datapath) {
	if dp == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.setSink(dp)
	n.applyLocked()
}

// setSink makes s the datapath of node isolation and gives it the tunnel
// ports (WireGuard, VXLAN) nodes always accept from each other; callers
// hold mu.
func (n *nodePeers) setSink(s nodeIsoSink) {
	n.iso = s
	var ports []uint16
	switch {
	case n.o.Encryption == "wireguard":
		ports = append(ports, uint16(n.o.WireGuardPort))
	case n.o.Routing == "vxlan":
		ports = append(ports, routing.DefaultVXLANPort)
	}
	if err := s.SetTunnelPorts(ports); err != nil {
		n.log.Error("node isolation: tunnel ports", zap.Error(err))
	}
}

func (n *nodePeers) applyLocked() {
	if n.iso == nil || n.last == nil {
		return
	}
	var remote []netip.Addr
	for name, p := range n.last {
		if name != n.o.NodeName {
			remote = append(remote, p.Addresses...)
		}
	}
	slices.SortFunc(remote, netip.Addr.Compare)
	if err := n.iso.SetRemoteNodeIPs(remote); err != nil {
		n.log.Error("node isolation: remote node addresses", zap.Error(err))
	}
	if n.dp == nil {
		return
	}
	n.applyHostRouting()
	n.attachDevices()
}

// attachDevices (re)attaches the node-to-node programs; callers hold mu.
func (n *nodePeers) attachDevices() {
	if n.dp == nil || n.last == nil {
		return
	}
	for _, d := range n.devices() {
		if err := n.dp.AttachNodeDevice(d.name, d.index, d.l3); err != nil {
			// Node-to-node isolation is not enforced on this device.
			n.log.Error("node isolation: attach to node device", zap.String("device", d.name), zap.Error(err))
		}
	}
	keep := n.attachTunnel()
	if n.prunedFor != nil && *n.prunedFor == keep {
		return
	}
	if err := n.dp.PruneDeviceHooks(keep); err != nil {
		n.log.Warn("remove stale device hooks", zap.Error(err))
		return
	}
	n.prunedFor = &keep
}

type nodeDevice struct {
	name  string
	index int
	l3    bool
}

// devices are the interfaces other nodes' traffic arrives on: those holding
// this node's peer addresses (the underlay) and the WireGuard device.
func (n *nodePeers) devices() []nodeDevice {
	var out []nodeDevice
	seen := map[int]bool{}
	if self := n.last[n.o.NodeName]; self != nil {
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			n.log.Warn("node isolation: list addresses", zap.Error(err))
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok || !slices.Contains(self.Addresses, ip.Unmap()) || seen[a.LinkIndex] {
				continue
			}
			l, err := netlink.LinkByIndex(a.LinkIndex)
			if err != nil {
				continue
			}
			seen[a.LinkIndex] = true
			out = append(out, nodeDevice{name: l.Attrs().Name, index: a.LinkIndex})
		}
	}
	if n.o.Encryption == "wireguard" {
		if l, err := netlink.LinkByName(n.o.WireGuardDevice); err == nil && !seen[l.Attrs().Index] {
			out = append(out, nodeDevice{name: l.Attrs().Name, index: l.Attrs().Index, l3: true})
		}
	}
	return out
}
