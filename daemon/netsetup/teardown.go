package netsetup

import (
	"fmt"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TeardownPod deletes the host veth hostIfName in the current netns; the
// kernel removes its pod-side peer and every route and neighbour entry on
// either end with it. It returns nil if the veth does not exist, and refuses
// to delete an interface that is not a Coordino veth.
func TeardownPod(hostIfName string) error {
	if err := validIfName("host interface name", hostIfName); err != nil {
		return fmt.Errorf("tear down pod: %w", err)
	}
	if !strings.HasPrefix(hostIfName, HostIfPrefix) {
		return fmt.Errorf("tear down pod: host interface name %q does not start with %q", hostIfName, HostIfPrefix)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("tear down host veth %s: netlink socket: %w", hostIfName, err)
	}
	defer h.Close()
	link, err := h.LinkByName(hostIfName)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("tear down host veth %s: look up: %w", hostIfName, err)
	}
	if link.Type() != "veth" {
		return fmt.Errorf("tear down host veth %s: it is a %s, not a veth; not deleting", hostIfName, link.Type())
	}
	if err := h.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("tear down host veth %s: delete: %w", hostIfName, err)
	}
	return nil
}

// ListHostIfaces returns the sorted names of the veths in the current netns
// whose name starts with HostIfPrefix.
func ListHostIfaces() ([]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list host veths: %w", err)
	}
	var names []string
	for _, l := range links {
		if l.Type() == "veth" && strings.HasPrefix(l.Attrs().Name, HostIfPrefix) {
			names = append(names, l.Attrs().Name)
		}
	}
	sort.Strings(names)
	return names, nil
}
