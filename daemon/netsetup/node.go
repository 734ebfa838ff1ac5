package netsetup

import (
	"github.com/vishvananda/netlink"
)

// fallbackMTU is used when the node has no default route to measure.
const fallbackMTU = 1500

// DefaultMTU returns the MTU of the device of the current netns' IPv4 default
// route, else of its IPv6 default route, else 1500.
func DefaultMTU() int {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlink.RouteListFiltered(fam, &netlink.Route{}, netlink.RT_FILTER_DST)
		if err != nil {
			continue
		}
		for _, r := range routes {
			idx := r.LinkIndex
			if idx == 0 && len(r.MultiPath) > 0 {
				idx = r.MultiPath[0].LinkIndex
			}
			if idx == 0 {
				continue
			}
			if l, err := netlink.LinkByIndex(idx); err == nil && l.Attrs().MTU > 0 {
				return l.Attrs().MTU
			}
		}
	}
	return fallbackMTU
}
