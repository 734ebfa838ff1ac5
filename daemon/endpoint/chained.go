package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/chaining"
	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/daemon/tracing"
)

// addChained attaches to the interface another plugin created: no IPAM, no
// veth, no netns pin — only Coordino's record and datapath, and prevResult
// passed through.
func (m *Manager) addChained(ctx context.Context, inv *request.Invocation) ([]byte, error) {
	_, span := tracing.Start(ctx, "netns.verify")
	err := m.verifyNetns(inv.Netns)
	tracing.End(span, err)
	if err != nil {
		return nil, err
	}
	peer, networks, err := m.chainedPeer(ctx, inv)
	if err != nil {
		return nil, err
	}
	ep := m.newEndpoint(inv, store.ModeChained)
	ep.HostIfName = peer.Name
	ep.Networks = networks
	ep.IPs = chaining.HostPrefixes(networks)
	if err := m.commitAndAttach(ctx, ep, peer.Index); err != nil {
		return nil, err
	}
	out, err := marshalResult(inv.PrevResult)
	if err != nil {
		_ = m.release(ep)
		return nil, err
	}
	m.learnChained(ctx, ep)
	return out, nil
}

// learnChained tells Config.Chained the networks of a chained attachment:
// before its ADD returns, so the pod's first connection is not
// masqueraded. Records from before Networks give their addresses.
func (m *Manager) learnChained(ctx context.Context, ep *store.Endpoint) {
	if m.cfg.Chained == nil {
		return
	}
	networks := ep.Networks
	if len(networks) == 0 {
		networks = ep.IPs
	}
	_, span := tracing.Start(ctx, "chained.learn_networks")
	m.cfg.Chained.LearnChained(ep.Key.String(), networks)
	tracing.End(span, nil)
}

// chainedPeer finds the host side of the pod interface and the pod's
// addresses, with their networks' lengths (chaining.PodNetworks). prevResult may not name the pod interface (Calico, AWS VPC CNI
// before 1.12 and others report only the host side): the kernel is asked in
// any case, by CNI_NETNS and CNI_IFNAME, and for the pod's addresses too
// when prevResult cannot say which they are.
func (m *Manager) chainedPeer(ctx context.Context, inv *request.Invocation) (*chaining.HostPeer, []netip.Prefix, error) {
	prev := inv.PrevResult
	idx := chaining.PodInterface(prev, inv.Netns, inv.Key.IfName)
	_, span := tracing.Start(ctx, "chaining.resolve_peer")
	peer, err := m.cfg.Network.ResolveHostPeer(inv.Netns, inv.Key.IfName, idx < 0)
	tracing.End(span, err)
	if err != nil {
		var nv *chaining.ErrNotVeth
		if errors.As(err, &nv) {
			return nil, nil, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
		}
		return nil, nil, internalError("resolve host side of %s: %v", inv.Key.IfName, err)
	}
	networks := chaining.PodNetworks(prev, idx, peer.PodAddrs)
	if idx < 0 && len(networks) == 0 && len(prev.IPs) > 0 {
		return nil, nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(
			"prevResult.ips: none of the primary's addresses is configured on %s in %s, and prevResult.interfaces does not name it", inv.Key.IfName, inv.Netns), "")
	}
	return peer, networks, nil
}

// commitAndAttach commits ep's record and attaches the datapath to the host
// interface side by side: the one waits for fsync, the other for the
// kernel's RCU grace periods, and neither needs the other. Attaching before
// the record is durable is crash-safe here because a chained attachment
// holds no kernel state but the datapath's, and the datapath's is keyed by
// the attachment: a daemon that starts detaches every attached endpoint no
// record names (ReconcileDatapath), and GC sweeps only veths and pins. The
// ADD succeeds only once both are done, so policy is enforced from the pod's
// first packet and a record survives any crash after success. On failure
// nothing is left: a committed record is released, an attach without a
// record is detached.
func (m *Manager) commitAndAttach(ctx context.Context, ep *store.Endpoint, hostIfIndex int) error {
	dpEndpoint := datapathEndpoint(ep, hostIfIndex) // before the commit touches ep
	committed := m.commitInBackground(ctx, ep)
	var attachErr error
	if m.cfg.Datapath != nil {
		attachErr = m.attach(ctx, dpEndpoint)
	}
	commitErr := committed.wait()
	switch {
	case commitErr != nil:
		if m.cfg.Datapath != nil && attachErr == nil {
			if err := m.cfg.Datapath.DetachEndpoint(dpEndpoint); err != nil {
				m.log(ctx).Error("undo datapath attach of an ADD whose record failed", zap.String("endpoint", ep.Key.String()), zap.Error(err))
			}
		}
		return internalError("%v", commitErr)
	case attachErr != nil:
		if err := m.release(ep); err != nil {
			m.log(ctx).Error("undo failed ADD", zap.String("endpoint", ep.Key.String()), zap.Error(err))
		}
		return attachError(ep.HostIfName, attachErr)
	}
	return nil
}
