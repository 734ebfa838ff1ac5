package bgp

import (
	"fmt"
	"net/netip"
)

// Guard is what a learned route must never cover or hijack: this node's
// own pod blocks, its addresses and the cluster's Service ranges.
type Guard struct {
	Blocks    []netip.Prefix
	Addresses []netip.Addr
	Services  []netip.Prefix
	// Encrypted are other nodes' blocks WireGuard carries (--encryption
	// with --routing=bgp): a learned route over one would send their pods'
	// traffic in clear.
	Encrypted []netip.Prefix
}

// Reject returns why a learned route to dst via nextHop must not be
// installed, or "" when it may be.
func (g Guard) Reject(dst netip.Prefix, nextHop netip.Addr) string {
	if !dst.IsValid() || dst.Bits() == 0 {
		return "a default route"
	}
	dst = dst.Masked()
	for _, b := range g.Blocks {
		if b.Overlaps(dst) {
			return fmt.Sprintf("overlaps this node's block %s", b)
		}
	}
	for _, a := range g.Addresses {
		if dst.Contains(a) {
			return fmt.Sprintf("covers this node's address %s", a)
		}
		if nextHop == a {
			return fmt.Sprintf("next hop %s is this node", a)
		}
	}
	for _, e := range g.Encrypted {
		if e.Overlaps(dst) {
			return fmt.Sprintf("overlaps %s, which WireGuard carries encrypted", e)
		}
	}
	for _, s := range g.Services {
		if s.Overlaps(dst) {
			return fmt.Sprintf("overlaps the Service range %s", s)
		}
	}
	if !nextHop.IsValid() || nextHop.IsUnspecified() || nextHop.IsLoopback() || nextHop.IsMulticast() {
		return fmt.Sprintf("next hop %v is not a unicast address", nextHop)
	}
	return ""
}
