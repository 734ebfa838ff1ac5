package endpoint

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/daemon/chaining"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/request"
	"github.com/coordino/coordino/daemon/store"
)

// Check verifies an attachment against the kernel and the store and says
// precisely what is wrong: every problem it finds, not only the first.
func (m *Manager) Check(ctx context.Context, inv *request.Invocation) error {
	unlock := m.lockKey(inv.Key)
	defer unlock()
	ep, err := m.cfg.Store.Get(inv.Key)
	if errors.Is(err, store.ErrNotFound) {
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf("no Coordino attachment %s", inv.Key), "")
	}
	if err != nil {
		return internalError("%v", err)
	}
	if err := m.verifyNetns(inv.Netns); err != nil {
		return err
	}
	var problems []error
	if ep.Netns != inv.Netns {
		problems = append(problems, fmt.Errorf("attachment was made in netns %s, CHECK names %s", ep.Netns, inv.Netns))
	}
	if inv.PrevResult != nil {
		problems = append(problems, m.checkPrevResult(ep, inv)...)
	}
	switch ep.Mode {
	case store.ModePrimary:
		problems = append(problems, m.checkPrimary(ep)...)
	case store.ModeChained:
		problems = append(problems, m.checkChained(ep, inv)...)
	}
	if len(problems) > 0 {
		return checkFailed(problems)
	}
	return nil
}

// checkPrevResult compares the recorded addresses with prevResult's.
func (m *Manager) checkPrevResult(ep *store.Endpoint, inv *request.Invocation) []error {
	idx := chaining.PodInterface(inv.PrevResult, inv.Netns, inv.Key.IfName)
	var onPod []netip.Addr
	if idx < 0 {
		// Not named by prevResult: the kernel says which addresses are the pod's.
		peer, err := m.cfg.Network.ResolveHostPeer(inv.Netns, inv.Key.IfName, true)
		if err != nil {
			return []error{err}
		}
		onPod = peer.PodAddrs
	}
	return sameAddresses(ep.IPs, chaining.PodAddresses(inv.PrevResult, idx, onPod))
}

// checkPrimary checks what a primary ADD made: the pin, the addresses'
// reservations and the veth pair with its addresses, routes and neighbours.
func (m *Manager) checkPrimary(ep *store.Endpoint) []error {
	var problems []error
	for _, ip := range ep.IPs {
		if !m.cfg.Pool.InUse(ip.Addr()) {
			problems = append(problems, fmt.Errorf("address %v is not reserved in IPAM", ip.Addr()))
		}
	}
	if err := m.cfg.Network.VerifyPin(ep.PinPath); err != nil {
		// Without the pin the pod's side cannot be looked at.
		return append(problems, fmt.Errorf("netns pin %s: %w", ep.PinPath, err))
	}
	if err := m.cfg.Network.CheckPod(netsetup.PodConfig{
		NetNSPath: ep.PinPath, IfName: ep.IfName, HostIfName: ep.HostIfName, MTU: ep.MTU, Addrs: ep.IPs,
	}); err != nil {
		problems = append(problems, err)
	}
	return problems
}

// checkChained checks that the pod interface's host-side peer is the one
// the datapath was attached to.
func (m *Manager) checkChained(ep *store.Endpoint, inv *request.Invocation) []error {
	peer, err := m.cfg.Network.ResolveHostPeer(inv.Netns, inv.Key.IfName, false)
	if err != nil {
		return []error{err}
	}
	if peer.Name != ep.HostIfName {
		return []error{fmt.Errorf("host-side peer of %s is %s, attachment was made on %s", inv.Key.IfName, peer.Name, ep.HostIfName)}
	}
	return nil
}

// sameAddresses compares the recorded addresses with those prevResult gives
// the pod interface, in the order of each list.
func sameAddresses(recorded, fromPrev []netip.Prefix) []error {
	var problems []error
	for _, a := range recorded {
		if !slices.Contains(fromPrev, a) {
			problems = append(problems, fmt.Errorf("address %v of the attachment is missing from prevResult", a.Addr()))
		}
	}
	for _, a := range fromPrev {
		if !slices.Contains(recorded, a) {
			problems = append(problems, fmt.Errorf("prevResult has address %v that the attachment does not hold", a.Addr()))
		}
	}
	return problems
}

// checkFailed is the CNI error of a CHECK that found problems, all named
// in one message, each once (a chained pod interface that is gone fails
// both the address and the peer check alike).
func checkFailed(problems []error) error {
	var msgs []string
	for _, p := range problems {
		if !slices.Contains(msgs, p.Error()) {
			msgs = append(msgs, p.Error())
		}
	}
	return types.NewError(types.ErrInternal, "CHECK failed: "+strings.Join(msgs, "; "), "")
}
