package daemon

import (
	"context"
	"sync"
	"time"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/peers"
	"github.com/coordino/coordino/daemon/wireguard"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// crossNodeStatus keeps what coordinoctl status shows of the cross-node
// datapath: its configuration, the last peer set it applied and, with
// encryption, the device to read handshakes from.
type crossNodeStatus struct {
	self, routing, encryption string
	dev                       *wireguard.Device // nil without encryption
	bgp                       *bgpNode          // nil without --routing=bgp

	mu      sync.Mutex
	applied peers.Set
}

func (c *crossNodeStatus) setApplied(s peers.Set) {
	c.mu.Lock()
	c.applied = s
	c.mu.Unlock()
}

// status answers the inspection service (inspect.Config.CrossNode).
func (c *crossNodeStatus) status(publishedKey string) *inspectv1.CrossNode {
	out := &inspectv1.CrossNode{Routing: c.routing, Encryption: c.encryption, PublicKey: publishedKey}
	var onDevice map[string]wireguard.PeerState
	var deviceErr error
	if c.dev != nil {
		out.Routing, out.WireguardDevice = "wireguard", "kernel"
		if c.dev.Userspace() {
			out.WireguardDevice = "userspace"
		}
		var states []wireguard.PeerState
		states, deviceErr = c.dev.Peers()
		onDevice = map[string]wireguard.PeerState{}
		for _, p := range states {
			onDevice[p.PublicKey.String()] = p
		}
	}
	c.mu.Lock()
	set := c.applied
	c.mu.Unlock()
	for _, name := range set.Names() {
		n := set[name]
		if name == c.self {
			continue
		}
		p := &inspectv1.Peer{Name: name}
		for _, a := range n.Addresses {
			p.Addresses = append(p.Addresses, a.String())
		}
		for _, b := range n.Blocks {
			p.Blocks = append(p.Blocks, b.String())
		}
		switch {
		case len(n.Addresses) == 0:
			p.Problem = "no address published yet: its pods are unreachable"
		case c.dev == nil:
		case n.WireGuard == nil:
			p.Problem = "no WireGuard key published yet: its pods are unreachable"
		case deviceErr != nil:
			p.PublicKey, p.Problem = n.WireGuard.PublicKey, deviceErr.Error()
		default:
			p.PublicKey = n.WireGuard.PublicKey
			st, ok := onDevice[n.WireGuard.PublicKey]
			if !ok {
				p.Problem = "not configured on the WireGuard device (see the daemon log)"
				break
			}
			p.Endpoint, p.RxBytes, p.TxBytes = st.Endpoint, st.Received, st.Transmitted
			if st.LastHandshake.Unix() > 0 {
				p.LastHandshakeUnix = st.LastHandshake.Unix()
			}
		}
		out.Peers = append(out.Peers, p)
	}
	out.BgpNeighbors = c.bgpNeighbors()
	return out
}

// bgpStatus is the node's NodeConfig status.bgp: its sessions (nil
// without --routing=bgp, or before a speaker runs).
func (x *crossNode) bgpStatus() []coordinov1alpha1.BGPSessionStatus {
	if x == nil {
		return nil
	}
	sp := x.st.bgp.speaker()
	if sp == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ns, err := sp.Neighbors(ctx)
	if err != nil {
		return nil
	}
	var out []coordinov1alpha1.BGPSessionStatus
	for _, n := range ns[:min(len(ns), 64)] {
		msg := n.Problem
		if len(msg) > 256 {
			msg = msg[:256]
		}
		out = append(out, coordinov1alpha1.BGPSessionStatus{Address: n.Address.String(), ASN: int64(n.ASN), State: n.State,
			Received: int64(n.Received), Accepted: int64(n.Accepted), Sent: int64(n.Sent), Message: msg})
	}
	return out
}

// bgpNeighbors are the speaker's sessions; an error shows as one entry.
func (c *crossNodeStatus) bgpNeighbors() []*inspectv1.BGPNeighbor {
	sp := c.bgp.speaker()
	if sp == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ns, err := sp.Neighbors(ctx)
	if err != nil {
		return []*inspectv1.BGPNeighbor{{Problem: err.Error()}}
	}
	var out []*inspectv1.BGPNeighbor
	for _, n := range ns {
		out = append(out, &inspectv1.BGPNeighbor{Address: n.Address.String(), Asn: n.ASN, State: n.State,
			Received: n.Received, Accepted: n.Accepted, Sent: n.Sent, Problem: n.Problem})
	}
	return out
}
