package nftdp

import (
	"net"
	"net/netip"

	"github.com/coordino/coordino/daemon/internal/testnet"
)

// probe6 is a TCP echo exchange with dst over IPv6.
func probe6(dst netip.Addr, port int) error {
	c, err := net.DialTimeout("tcp6", netip.AddrPortFrom(dst, uint16(port)).String(), testnet.Timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	return testnet.Echo(c)
}
