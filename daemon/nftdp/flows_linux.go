package nftdp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// flowReadBuffer is the receive buffer of the flow log socket: a burst
// the daemon cannot read at once waits there; past it the kernel drops
// messages (counted as lost events).
const flowReadBuffer = 4 << 20

// The kernel sends the group's messages in batches of flowLogBatch, or
// when the oldest has waited flowLogBatchTimeout (in its 10 ms ticks).
const (
	flowLogBatch        = 64
	flowLogBatchTimeout = 100 * time.Millisecond
)

// flowCounters are the flow log's losses, read by the metrics.
type flowCounters struct {
	lost atomic.Uint64 // messages the socket could not hold
}

// SetEmitAllowed chooses whether allowed new flows are reported. Drops
// are always reported (within the flow log limits). It is one
// transaction on the allowed-flow chains.
func (d *Datapath) SetEmitAllowed(on bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, err := d.newConn()
	if err != nil {
		return err
	}
	d.lay.setAllowed(c, on)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables datapath: turn allowed-flow reports %s: %w", map[bool]string{true: "on", false: "off"}[on], err)
	}
	d.emitAllowed = on
	return nil
}

// EmitAllowed reports whether allowed new flows are being reported.
func (d *Datapath) EmitAllowed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.emitAllowed
}

// ReadFlows delivers flow events to fn until ctx ends: it binds the
// NFLOG group the table logs to, in the datapath's network namespace.
// Run a single ReadFlows per datapath (the group has one listener).
func (d *Datapath) ReadFlows(ctx context.Context, fn func(datapath.Flow)) error {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: d.cfg.NetNS})
	if err != nil {
		return fmt.Errorf("nftables datapath: open the flow log socket: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer func() {
		if stop() {
			c.Close()
		}
	}()
	if err := c.SetReadBuffer(flowReadBuffer); err != nil {
		d.log.Warn("flow log socket keeps the default receive buffer", zap.Error(err))
	}
	if err := logConfig(c, nfulnlCfgBind); err != nil {
		return fmt.Errorf("nftables datapath: bind NFLOG group %d (needs nfnetlink_log): %w", FlowLogGroup, err)
	}
	// The group is free again for the next reader (a restarted daemon).
	defer func() {
		if ctx.Err() == nil {
			_ = logConfig(c, nfulnlCfgUnbind)
		}
	}()
	for {
		msgs, err := c.Receive()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, unix.ENOBUFS) {
				d.flowCounts.lost.Add(1)
				continue
			}
			return fmt.Errorf("nftables datapath: read the flow log: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Type != netlink.HeaderType(nfnlSubsysULOG<<8|nfulnlMsgPacket) {
				continue
			}
			p, err := parseLogMessage(m.Data)
			if err != nil {
				continue
			}
			if f, ok := d.flowOf(p); ok {
				fn(f)
			}
		}
	}
}

// logConfig sends an NFULNL_MSG_CONFIG command for the flow log group;
// binding also asks for the packet's first flowSnaplen bytes and for
// batches sent after flowLogBatchTimeout at the latest (the kernel's
// default waits a second), as the eBPF datapath's reader polls.
func logConfig(c *netlink.Conn, cmd uint8) error {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.Bytes(nfulaCfgCmd, []byte{cmd})
	if cmd == nfulnlCfgBind {
		mode := make([]byte, 6) // struct nfulnl_msg_config_mode: be32 range, u8 mode, pad
		mode[0], mode[1], mode[2], mode[3] = 0, 0, 0, flowSnaplen
		mode[4] = nfulnlCopyPacket
		ae.Bytes(nfulaCfgMode, mode)
		ae.Uint32(nfulaCfgTimeout, uint32(flowLogBatchTimeout/(10*time.Millisecond)))
		ae.Uint32(nfulaCfgQThresh, flowLogBatch)
	}
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	hdr := []byte{unix.AF_UNSPEC, nfnetlinkV0, byte(FlowLogGroup >> 8), byte(FlowLogGroup & 0xff)}
	_, err = c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysULOG<<8 | nfulnlMsgConfig),
			Flags: netlink.Request | netlink.Acknowledge},
		Data: append(hdr, attrs...),
	})
	return err
}

// flowOf turns a logged packet into the flow event the eBPF datapath
// would report: the endpoint it was judged for, both identities and the
// reason (for allowed flows, named from the endpoint's isolation).
func (d *Datapath) flowOf(p logPacket) (datapath.Flow, bool) {
	pfx, ok := parseLogPrefix(p.prefix)
	if !ok {
		return datapath.Flow{}, false
	}
	h, ok := parsePacketHeader(p.payload)
	if !ok {
		return datapath.Flow{}, false
	}
	f := datapath.Flow{Time: p.time, Direction: directionName(pfx.dir), Verdict: "dropped", Reason: pfx.reason,
		Protocol: datapath.ProtocolName(h.proto), Src: h.src, Dst: h.dst, LocalIdentity: uint32(pfx.local)}
	if f.Time.IsZero() {
		f.Time = time.Now()
	}
	if portProto(h.proto) {
		f.SrcPort, f.DstPort = h.sport, h.dport
	}
	var peer netip.Addr
	f.IfIndex, peer = p.outIf, h.src
	if pfx.dir == policy.Egress {
		f.IfIndex, peer = p.inIf, h.dst
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.byIfIndex(int(f.IfIndex))
	if r != nil {
		f.Endpoint = r.Key
		if f.LocalIdentity == 0 {
			f.LocalIdentity = uint32(r.Identity)
		}
	}
	remote := d.identityOf(peer)
	f.RemoteIdentity = uint32(remote)
	if pfx.reason == reasonAllowed {
		f.Verdict = "allowed"
		switch {
		case pfx.dir == policy.Ingress && remote == identity.Host:
			f.Reason = "host"
		case r != nil && d.inst.eps[r.HostIfName].iso.Has(pfx.dir):
			f.Reason = "policy"
		default:
			f.Reason = "not-isolated"
		}
	}
	return f, true
}

// byIfIndex finds the endpoint of a host interface; callers hold mu.
func (d *Datapath) byIfIndex(ifindex int) *record {
	for _, r := range d.eps {
		if r.HostIfIndex == ifindex && ifindex != 0 {
			return r
		}
	}
	return nil
}

// identityOf is the identity the table gives peer address a: a pod's,
// the node's, else the CIDR identity of the longest ipBlock prefix
// holding it (the world when none does). Callers hold mu.
func (d *Datapath) identityOf(a netip.Addr) identity.ID {
	a = a.Unmap()
	if slices.Contains(d.nodeIPs, a) {
		return identity.Host
	}
	if d.isRemoteNode(a) {
		return identity.RemoteNode
	}
	if id, ok := d.remote[a]; ok {
		return id
	}
	for _, r := range d.eps {
		if slices.Contains(r.IPs, a) {
			return r.Identity
		}
	}
	return d.engine.CIDRIdentity(a)
}

// flowLost reads the flow log's lost messages (metrics).
func (d *Datapath) flowLost() float64 { return float64(d.flowCounts.lost.Load()) }
