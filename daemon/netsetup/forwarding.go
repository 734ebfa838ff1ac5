package netsetup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// sysctlNet is where the network sysctls of the opening thread's netns live.
const sysctlNet = "/proc/sys/net"

// EnableForwarding turns on IPv4 forwarding and, if v6, IPv6 forwarding, in
// the network namespace of the calling thread, without costing the node its
// router advertisements.
//
// Linux forwards IPv6 only while conf/all/forwarding is 1 (there is no
// per-interface switch before kernel 6.17's force_forwarding), and setting it
// makes every interface a router: interfaces with accept_ra=1 stop accepting
// RAs, and the kernel at once deletes RA-learned default routes except on
// interfaces with accept_ra=2. So every interface the node relies on RAs
// through is first moved to accept_ra=2, which keeps it accepting them with
// forwarding on; only then is forwarding enabled. Every other interface,
// pod-facing ones above all, ends up ignoring RAs, as must any interface a
// pod can send an RA to.
func EnableForwarding(v6 bool) error {
	if err := setNetSysctl("ipv4/ip_forward", "1"); err != nil {
		return err
	}
	if !v6 {
		return nil
	}
	if on, err := netSysctl("ipv6/conf/all/forwarding"); err != nil {
		return err
	} else if on == "1" {
		return nil // already a router: its RA settings are the admin's choice
	}
	if err := keepAcceptingRAs(); err != nil {
		return err
	}
	return setNetSysctl("ipv6/conf/all/forwarding", "1")
}

// keepAcceptingRAs sets accept_ra=2 on every interface that accepts router
// advertisements now (accept_ra=1, not forwarding) and that the node relies
// on them through: it has a route learned from an RA or an address with a
// lifetime (SLAAC or DHCPv6, both driven by RAs).
func keepAcceptingRAs() error {
	links, err := raDependentLinks()
	if err != nil {
		return err
	}
	for _, name := range links {
		if strings.HasPrefix(name, HostIfPrefix) {
			continue // a pod's veth: never let pods steer the node
		}
		conf := "ipv6/conf/" + name + "/"
		acceptRA, err1 := netSysctl(conf + "accept_ra")
		forwarding, err2 := netSysctl(conf + "forwarding")
		if err := errors.Join(err1, err2); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // the interface went away meanwhile
			}
			return err
		}
		if acceptRA != "1" || forwarding != "0" {
			continue
		}
		if err := setNetSysctl(conf+"accept_ra", "2"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// raDependentLinks names the interfaces with an RA-learned IPv6 route or a
// global IPv6 address that is not permanent.
func raDependentLinks() ([]string, error) {
	idx := map[int]bool{}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Protocol: unix.RTPROT_RA}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return nil, fmt.Errorf("list RA-learned routes: %w", err)
	}
	for _, r := range routes {
		idx[r.LinkIndex] = true
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V6)
	if err != nil {
		return nil, fmt.Errorf("list IPv6 addresses: %w", err)
	}
	for _, a := range addrs {
		if a.Scope == unix.RT_SCOPE_UNIVERSE && a.Flags&unix.IFA_F_PERMANENT == 0 {
			idx[a.LinkIndex] = true
		}
	}
	var names []string
	for i := range idx {
		if l, err := netlink.LinkByIndex(i); err == nil {
			names = append(names, l.Attrs().Name)
		}
	}
	return names, nil
}

func netSysctl(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(sysctlNet, name))
	if err != nil {
		return "", fmt.Errorf("read net.%s: %w", strings.ReplaceAll(name, "/", "."), err)
	}
	return strings.TrimSpace(string(b)), nil
}

func setNetSysctl(name, value string) error {
	if err := os.WriteFile(filepath.Join(sysctlNet, name), []byte(value), 0o644); err != nil {
		return fmt.Errorf("enable forwarding: write net.%s=%s: %w", strings.ReplaceAll(name, "/", "."), value, err)
	}
	return nil
}
