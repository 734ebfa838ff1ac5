package netsetup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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
// interfaces with accept_ra=2. So every interface that accepts RAs now
// (accept_ra=1, not forwarding) is first moved to accept_ra=2, which keeps
// it accepting them with forwarding on; only then is forwarding enabled.
// Interfaces created later (pod veths) inherit forwarding from conf/default
// and so ignore RAs, which is what a pod-facing interface must do.
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
// advertisements now, so that turning on forwarding changes nothing for it.
func keepAcceptingRAs() error {
	entries, err := os.ReadDir(filepath.Join(sysctlNet, "ipv6/conf"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // IPv6 disabled in this netns
	}
	if err != nil {
		return fmt.Errorf("list IPv6 interfaces: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		if name == "all" || name == "default" || name == "lo" || strings.HasPrefix(name, HostIfPrefix) {
			continue // pod-facing veths must never accept RAs from pods
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
