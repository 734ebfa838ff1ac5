package endpoint

import (
	"errors"

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
	idx, err := chaining.PodInterface(prev, inv.Netns, inv.Key.IfName)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	peer, err := chaining.ResolveHostPeer(inv.Netns, inv.Key.IfName)
	if err != nil {
		var nv *chaining.ErrNotVeth
		if errors.As(err, &nv) {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
		}
		return nil, internalError("resolve host side of %s: %v", inv.Key.IfName, err)
	}
	ep := m.newEndpoint(inv, store.ModeChained)
	ep.HostIfName = peer.Name
	ep.IPs = resultAddresses(prev, idx)
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
			return nil, internalError("attach datapath to %s: %v", peer.Name, err)
		}
	}
	return marshalResult(prev)
}
