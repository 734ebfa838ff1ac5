package chaining

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// PodInterface returns the index in prev.Interfaces of the interface named
// ifname inside sandbox, as the spec asks a chained plugin to find it, or -1
// when prevResult does not name it: Calico, older AWS VPC CNI and others
// report only the host-side interface, and some omit the sandbox.
func PodInterface(prev *current.Result, sandbox, ifname string) int {
	for i, iface := range prev.Interfaces {
		if iface != nil && iface.Name == ifname && iface.Sandbox == sandbox {
			return i
		}
	}
	return -1
}

// PodAddresses returns, as host prefixes, the addresses prevResult gives the
// pod interface (PodNetworks).
func PodAddresses(prev *current.Result, idx int, onPod []netip.Addr) []netip.Prefix {
	return HostPrefixes(PodNetworks(prev, idx, onPod))
}

// HostPrefixes are the addresses of networks, each as a host prefix.
func HostPrefixes(networks []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range networks {
		out = append(out, netip.PrefixFrom(p.Addr(), p.Addr().BitLen()))
	}
	return out
}

// PodNetworks returns the addresses prevResult gives the pod interface,
// each with the prefix length prevResult gives it (10.22.0.5/16: the
// address and the network it sits on; a host prefix when the mask is
// missing or malformed). When prevResult names the interface (idx >= 0)
// these are the IPs of that interface and those bound to none. When it does
// not, which IP belongs to the pod cannot be read from the JSON, so the
// kernel decides: the IPs actually configured on the pod interface (onPod).
func PodNetworks(prev *current.Result, idx int, onPod []netip.Addr) []netip.Prefix {
	configured := map[netip.Addr]bool{}
	for _, a := range onPod {
		configured[a.Unmap()] = true
	}
	var out []netip.Prefix
	for _, ip := range prev.IPs {
		a, ok := netip.AddrFromSlice(ip.Address.IP)
		if !ok {
			continue
		}
		a = a.Unmap()
		switch {
		case idx >= 0 && ip.Interface != nil && *ip.Interface != idx:
			continue
		case idx < 0 && !configured[a]:
			continue
		}
		out = append(out, netip.PrefixFrom(a, prefixLen(a, ip.Address.Mask)))
	}
	return out
}

// prefixLen is the length of mask for address a: a's full length when the
// mask is not a prefix of a's family (an IPv4 mask may come in 16 bytes).
func prefixLen(a netip.Addr, mask net.IPMask) int {
	ones, bits := mask.Size()
	if a.Is4() && bits == 128 && ones >= 96 {
		ones, bits = ones-96, 32
	}
	if bits != a.BitLen() {
		return a.BitLen()
	}
	return ones
}

// HostPeer is the host-side end of a pod's veth.
type HostPeer struct {
	Name  string
	Index int
	// PodAddrs are the addresses configured on the pod-side interface, when
	// asked for.
	PodAddrs []netip.Addr
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
// namespace, of the veth ifname inside the namespace at netnsPath. With
// podAddrs it also lists the pod interface's addresses: one more netlink
// dump, needed only when prevResult does not say which addresses are the pod's.
//
// Without podAddrs it asks from the host first (resolveFromHost: three
// requests on one open socket); it enters the pod's namespace only when
// that cannot decide.
func ResolveHostPeer(netnsPath, ifname string, podAddrs bool) (*HostPeer, error) {
	podNS, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", netnsPath, err)
	}
	defer podNS.Close()
	if !podAddrs {
		if sh, err := hostSocket(); err == nil {
			if peer, err := resolveFromHost(sh, int(podNS), ifname); !errors.Is(err, errUndecided) {
				return peer, err
			}
		}
	}
	return resolveInPodNetns(podNS, netnsPath, ifname, podAddrs)
}

// resolveInPodNetns is ResolveHostPeer from inside the pod's namespace.
func resolveInPodNetns(podNS netns.NsHandle, netnsPath, ifname string, podAddrs bool) (*HostPeer, error) {
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
	peer := &HostPeer{Name: host.Attrs().Name, Index: peerIndex}
	if !podAddrs {
		return peer, nil
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("addresses of pod interface %s in %s: %w", ifname, netnsPath, err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			peer.PodAddrs = append(peer.PodAddrs, ip.Unmap())
		}
	}
	return peer, nil
}
