package datapath

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// interfaceName returns the name of the interface with index ifindex in the
// calling thread's network namespace. One SIOCGIFNAME ioctl: a netlink link
// lookup decodes every attribute and statistic of the link, and this runs
// on every attach.
func interfaceName(ifindex int) (string, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("socket for SIOCGIFNAME: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return "", err
	}
	ifr.SetUint32(uint32(ifindex)) // ifr_ifindex
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFNAME, ifr); err != nil {
		return "", err
	}
	return ifr.Name(), nil
}
