package netsetup

import (
	"fmt"
	"os"

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

// EnableForwarding turns on IPv4 forwarding, and IPv6 forwarding on all
// interfaces if v6, in the network namespace of the calling thread.
func EnableForwarding(v6 bool) error {
	// /proc/sys/net shows the netns of the thread that opens it.
	files := []string{"/proc/sys/net/ipv4/ip_forward"}
	if v6 {
		files = append(files, "/proc/sys/net/ipv6/conf/all/forwarding")
	}
	for _, f := range files {
		if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("enable forwarding: write %s: %w", f, err)
		}
	}
	return nil
}
