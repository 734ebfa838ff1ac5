package endpoint

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/daemon/chaining"
	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
	"github.com/coordino/coordino/daemon/tracing"
)

// addChained attaches to the interface another plugin created: no IPAM, no
// veth, no netns pin — only Coordino's record and datapath, and prevResult
// passed through.
func (m *Manager) addChained(inv *request.Invocation) (_ []byte, err error) {
	prev := inv.PrevResult
	if err := verifyNetns(inv.Netns); err != nil {
		return nil, err
	}
	// prevResult may not name the pod interface (Calico, AWS VPC CNI before
	// 1.12 and others report only the host side): the kernel is asked in any
	// case, by CNI_NETNS and CNI_IFNAME.
	peer, err := chaining.ResolveHostPeer(inv.Netns, inv.Key.IfName)
	if err != nil {
		var nv *chaining.ErrNotVeth
		if errors.As(err, &nv) {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
		}
		return nil, internalError("resolve host side of %s: %v", inv.Key.IfName, err)
	}
	idx := chaining.PodInterface(prev, inv.Netns, inv.Key.IfName)
	ips := chaining.PodAddresses(prev, idx, peer.PodAddrs)
	if idx < 0 && len(ips) == 0 && len(prev.IPs) > 0 {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(
			"prevResult.ips: none of the primary's addresses is configured on %s in %s, and prevResult.interfaces does not name it", inv.Key.IfName, inv.Netns), "")
	}
	ep := m.newEndpoint(inv, store.ModeChained)
	ep.HostIfName = peer.Name
	ep.IPs = ips
	_, span := tracing.Start(inv.Ctx, "store.commit")
	err = m.Store.Put(ep)
	tracing.End(span, err)
	if err != nil {
		return nil, internalError("%v", err)
	}
	defer func() {
		if err != nil {
			_ = m.release(ep)
		}
	}()
	if m.Datapath != nil {
		_, span := tracing.Start(inv.Ctx, "bpf.attach")
		err = m.Datapath.AttachEndpoint(datapathEndpoint(ep, peer.Index))
		tracing.End(span, err)
		if err != nil {
			return nil, attachError(peer.Name, err)
		}
	}
	return marshalResult(prev)
}
