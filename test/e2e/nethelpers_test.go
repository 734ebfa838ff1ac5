package e2e

import "net"

type netIPNet = net.IPNet

var netCIDRMask = net.CIDRMask
