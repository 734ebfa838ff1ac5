package chaining

import (
	"fmt"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// PodInterface returns the index in prev.Interfaces of the interface named
// ifname inside sandbox, as the spec requires a chained plugin to find it.
func PodInterface(prev *current.Result, sandbox, ifname string) (int, error) {
	for i, iface := range prev.Interfaces {
		if iface != nil && iface.Name == ifname && iface.Sandbox == sandbox {
			return i, nil
		}
	}
	return -1, fmt.Errorf("prevResult has no interface %q in sandbox %q", ifname, sandbox)
}

// HostPeer is the host-side end of a pod's veth.
type HostPeer struct {
	Name  string
	Index int
}

// ErrNotVeth is wrapped when the pod interface is not a veth (macvlan,
// ipvlan, host-device...): it has no host-side peer to attach to.
type ErrNotVeth struct {
	IfName, Kind string
}

func (e *ErrNotVeth) Error() string {
	return fmt.Sprintf("pod interface %s is a %s, not a veth: Coordino chained mode attaches to the host-side veth peer and supports veth-based primary plugins only", e.IfName, e.Kind)
}

// ResolveHostPeer finds the host-side peer, in the caller's network
// namespace, of the veth ifname inside the namespace at netnsPath.
func ResolveHostPeer(netnsPath, ifname string) (*HostPeer, error) {
	podNS, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", netnsPath, err)
	}
	defer podNS.Close()
	h, err := netlink.NewHandleAt(podNS)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", netnsPath, err)
	}
	defer h.Close()
	link, err := h.LinkByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("pod interface %s in %s: %w", ifname, netnsPath, err)
	}
	veth, ok := link.(*netlink.Veth)
	if !ok {
		return nil, &ErrNotVeth{IfName: ifname, Kind: link.Type()}
	}
	// IFLA_LINK of a veth is its peer's index in the peer's namespace.
	peerIndex := veth.Attrs().ParentIndex
	if peerIndex == 0 {
		return nil, fmt.Errorf("pod interface %s in %s reports no veth peer", ifname, netnsPath)
	}
	host, err := netlink.LinkByIndex(peerIndex)
	if err != nil {
		return nil, fmt.Errorf("host-side peer (index %d) of %s is not in the daemon's network namespace: %w", peerIndex, ifname, err)
	}
	// An index names a link only within one netns: confirm it really is our peer.
	hostVeth, ok := host.(*netlink.Veth)
	if !ok {
		return nil, fmt.Errorf("link %s (index %d) is not the veth peer of pod interface %s", host.Attrs().Name, peerIndex, ifname)
	}
	nsid, nsErr := netlink.GetNetNsIdByFd(int(podNS))
	if hostVeth.Attrs().ParentIndex != link.Attrs().Index || (nsErr == nil && nsid >= 0 && hostVeth.Attrs().NetNsID != nsid) {
		return nil, fmt.Errorf("link %s (index %d) is not the veth peer of pod interface %s", host.Attrs().Name, peerIndex, ifname)
	}
	return &HostPeer{Name: host.Attrs().Name, Index: peerIndex}, nil
}
