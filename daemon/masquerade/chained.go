package masquerade

import (
	"fmt"
	"net/netip"
)

// The widest networks a chained attachment may keep from the masquerade:
// a prevResult is written by the primary plugin, not by the pod, but what
// it names is bounded all the same. Wider, only the pod's own address is
// kept.
const (
	MinChainedBits4 = 8
	MinChainedBits6 = 32
)

// ChainedNetwork is the cluster destination a pod that another plugin
// addressed (a chained attachment) adds: the network prevResult puts it on
// (p, the pod's address with that network's length), as long as it is no
// wider than MinChainedBits4 (MinChainedBits6) and holds no node address;
// otherwise the pod's own address alone, and why in narrowed. ok is false
// when that address is itself a node's (nothing is added).
func ChainedNetwork(p netip.Prefix, nodeAddrs []netip.Addr) (dst netip.Prefix, narrowed error, ok bool) {
	a := p.Addr().Unmap()
	host := netip.PrefixFrom(a, a.BitLen())
	network := netip.PrefixFrom(a, p.Bits()).Masked()
	minBits := MinChainedBits4
	if a.Is6() {
		minBits = MinChainedBits6
	}
	switch {
	case !network.IsValid():
		narrowed = fmt.Errorf("prefix length %d does not fit address %s", p.Bits(), a)
	case network.Bits() < minBits:
		narrowed = fmt.Errorf("network %s is wider than /%d", network, minBits)
	default:
		for _, n := range nodeAddrs {
			if network.Contains(n.Unmap()) {
				narrowed = fmt.Errorf("network %s holds node address %s", network, n)
				break
			}
		}
	}
	if narrowed == nil {
		return network, nil, true
	}
	for _, n := range nodeAddrs {
		if n.Unmap() == a {
			return netip.Prefix{}, fmt.Errorf("%w, and the pod's address is a node's", narrowed), false
		}
	}
	return host, narrowed, a.IsValid()
}
