package endpoint

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/daemon/chaining"
	"github.com/coordino/coordino/daemon/netns"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
)

// Check verifies an attachment against the kernel and the store and says
// precisely what is wrong.
func (m *Manager) Check(inv *request.Invocation) error {
	unlock := m.lockKey(inv.Key)
	defer unlock()
	ep, err := m.Store.Get(inv.Key)
	if errors.Is(err, store.ErrNotFound) {
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf("no Coordino attachment %s", inv.Key), "")
	}
	if err != nil {
		return internalError("%v", err)
	}
	if err := verifyNetns(inv.Netns); err != nil {
		return err
	}
	if ep.Netns != inv.Netns {
		return checkFailed("attachment was made in netns %s, CHECK names %s", ep.Netns, inv.Netns)
	}
	if inv.PrevResult != nil {
		idx := chaining.PodInterface(inv.PrevResult, inv.Netns, inv.Key.IfName)
		var onPod []netip.Addr
		if idx < 0 {
			// Not named by prevResult: the kernel says which addresses are the pod's.
			peer, err := chaining.ResolveHostPeer(inv.Netns, inv.Key.IfName, true)
			if err != nil {
				return checkFailed("%v", err)
			}
			onPod = peer.PodAddrs
		}
		if err := sameAddresses(ep.IPs, chaining.PodAddresses(inv.PrevResult, idx, onPod)); err != nil {
			return checkFailed("%v", err)
		}
	}
	switch ep.Mode {
	case store.ModePrimary:
		if err := netns.Verify(ep.PinPath); err != nil {
			return checkFailed("netns pin %s: %v", ep.PinPath, err)
		}
		for _, ip := range ep.IPs {
			if !m.Pool.InUse(ip.Addr()) {
				return checkFailed("address %v is not reserved in IPAM", ip.Addr())
			}
		}
		if err := netsetup.CheckPod(netsetup.PodConfig{
			NetNSPath: ep.PinPath, IfName: ep.IfName, HostIfName: ep.HostIfName, MTU: ep.MTU, Addrs: ep.IPs,
		}); err != nil {
			return checkFailed("%v", err)
		}
	case store.ModeChained:
		peer, err := chaining.ResolveHostPeer(inv.Netns, inv.Key.IfName, false)
		if err != nil {
			return checkFailed("%v", err)
		}
		if peer.Name != ep.HostIfName {
			return checkFailed("host-side peer of %s is %s, attachment was made on %s", inv.Key.IfName, peer.Name, ep.HostIfName)
		}
	}
	return nil
}

// sameAddresses compares the recorded addresses with those prevResult gives the pod interface.
func sameAddresses(recorded, fromPrev []netip.Prefix) error {
	want := map[netip.Prefix]bool{}
	for _, p := range recorded {
		want[p] = true
	}
	got := map[netip.Prefix]bool{}
	for _, p := range fromPrev {
		got[p] = true
	}
	for a := range want {
		if !got[a] {
			return fmt.Errorf("address %v of the attachment is missing from prevResult", a.Addr())
		}
	}
	for a := range got {
		if !want[a] {
			return fmt.Errorf("prevResult has address %v that the attachment does not hold", a.Addr())
		}
	}
	return nil
}

func checkFailed(format string, args ...any) error {
	return types.NewError(types.ErrInternal, "CHECK failed: "+fmt.Sprintf(format, args...), "")
}
