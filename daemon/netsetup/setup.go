package netsetup

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	nsfile "github.com/coordino/coordino/daemon/netns"
)

// loopbackIndex is LOOPBACK_IFINDEX: lo has ifindex 1 in every namespace.
const loopbackIndex = 1

// SetupPod creates the veth pair for cfg with its peer directly in the pod
// namespace and configures both sides (see the package doc). A stale host veth
// of the same name is deleted first; an existing cfg.IfName in the pod is an
// error. On any error nothing SetupPod created remains, and the error names
// the step and the object.
func SetupPod(cfg PodConfig) (*Attachment, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := nsfile.Verify(cfg.NetNSPath); err != nil {
		return nil, fmt.Errorf("set up pod %s: %w", cfg.IfName, err)
	}
	nsf, err := os.Open(cfg.NetNSPath)
	if err != nil {
		return nil, fmt.Errorf("set up pod %s: open netns: %w", cfg.IfName, err)
	}
	defer nsf.Close()

	host, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("set up pod %s: netlink socket in host netns: %w", cfg.IfName, err)
	}
	defer host.Close()
	// The socket is created inside the pod netns (the library switches a
	// locked thread briefly); every request on it then acts there.
	pod, err := netlink.NewHandleAt(netns.NsHandle(nsf.Fd()), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("set up pod %s: netlink socket in netns %s: %w", cfg.IfName, cfg.NetNSPath, err)
	}
	defer pod.Close()

	att := &Attachment{
		HostIfName: cfg.HostIfName,
		HostMAC:    randomMAC(),
		PodMAC:     randomMAC(),
		MTU:        cfg.MTU,
	}
	if att.MTU == 0 {
		att.MTU = DefaultMTU()
	}

	if err := createVeth(host, pod, int(nsf.Fd()), cfg, att); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			// Deleting the host end removes the pod end and every route and
			// neighbour entry on either, so this undoes the whole setup.
			_ = host.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: att.HostIfIndex, Name: cfg.HostIfName}})
		}
	}()

	var alongside chan error
	if cfg.WhileConfiguring != nil {
		alongside = make(chan error, 1)
		go func() { alongside <- cfg.WhileConfiguring(att.HostIfIndex, att.HostMAC, att.PodMAC) }()
	}
	err = configurePodSide(pod, cfg, att)
	if err != nil {
		err = fmt.Errorf("set up pod interface %s in %s: %w", cfg.IfName, cfg.NetNSPath, err)
	} else if err = configureHostSide(host, cfg, att); err != nil {
		err = fmt.Errorf("set up host veth %s: %w", cfg.HostIfName, err)
	}
	if alongside != nil {
		// Waited for even after a failure: nothing may still act on the
		// veth once the deferred cleanup has deleted it.
		if aerr := <-alongside; err == nil {
			err = aerr
		}
	}
	if err != nil {
		return nil, err
	}
	ok = true
	return att, nil
}

// createVeth creates the pair, replacing a stale host veth of the same name,
// and fills in both ifindexes.
func createVeth(host, pod *netlink.Handle, nsFd int, cfg PodConfig, att *Attachment) error {
	err := addVeth(nsFd, cfg, att)
	if !errors.Is(err, unix.EEXIST) {
		if err != nil {
			return fmt.Errorf("create veth %s (peer %s in %s): %w", cfg.HostIfName, cfg.IfName, cfg.NetNSPath, err)
		}
		return nil
	}
	// EEXIST: either a host veth left by a crashed ADD, or IfName is taken in
	// the pod. Only the former is ours to remove.
	stale, lerr := host.LinkByName(cfg.HostIfName)
	switch {
	case lerr == nil && stale.Type() != "veth":
		return fmt.Errorf("create veth %s: a %s interface of that name exists in the host netns", cfg.HostIfName, stale.Type())
	case lerr == nil:
		if derr := host.LinkDel(stale); derr != nil && !isNotFound(derr) {
			return fmt.Errorf("delete stale host veth %s: %w", cfg.HostIfName, derr)
		}
		err = addVeth(nsFd, cfg, att)
		if err == nil {
			return nil
		}
	case !isNotFound(lerr):
		return fmt.Errorf("create veth %s: %w (and looking it up failed: %v)", cfg.HostIfName, err, lerr)
	}
	if errors.Is(err, unix.EEXIST) {
		if _, perr := pod.LinkByName(cfg.IfName); perr == nil {
			return fmt.Errorf("create veth %s: interface %s already exists in netns %s", cfg.HostIfName, cfg.IfName, cfg.NetNSPath)
		}
	}
	return fmt.Errorf("create veth %s (peer %s in %s): %w", cfg.HostIfName, cfg.IfName, cfg.NetNSPath, err)
}

// addVeth sends one RTM_NEWLINK that creates the pair up on the host side,
// with both MACs and MTUs, and the peer named and placed in the pod netns.
// NLM_F_ECHO makes the kernel (6.3+) return the new link, whose IFLA_LINK is
// the peer's ifindex: that saves the two lookups netlink.LinkAdd would need.
func addVeth(nsFd int, cfg PodConfig, att *Attachment) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK|unix.NLM_F_ECHO)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Flags = unix.IFF_UP
	msg.Change = unix.IFF_UP
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(cfg.HostIfName)))
	req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(att.MTU))))
	req.AddData(nl.NewRtAttr(unix.IFLA_ADDRESS, att.HostMAC))

	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("veth"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	peer := data.AddRtAttr(nl.VETH_INFO_PEER, nil)
	nl.NewIfInfomsgChild(peer, unix.AF_UNSPEC)
	peer.AddRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(cfg.IfName))
	peer.AddRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(att.MTU)))
	peer.AddRtAttr(unix.IFLA_ADDRESS, att.PodMAC)
	peer.AddRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(nsFd)))
	req.AddData(info)

	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		l, err := netlink.LinkDeserialize(nil, m)
		if err != nil || l.Attrs().Name != cfg.HostIfName {
			continue
		}
		att.HostIfIndex = l.Attrs().Index
		att.PodIfIndex = l.Attrs().ParentIndex
	}
	if att.HostIfIndex == 0 || att.PodIfIndex == 0 {
		return lookupIndexes(cfg, att) // kernel without NLM_F_ECHO on RTM_NEWLINK
	}
	return nil
}

func lookupIndexes(cfg PodConfig, att *Attachment) error {
	l, err := netlink.LinkByName(cfg.HostIfName)
	if err != nil {
		return fmt.Errorf("look up new veth: %w", err)
	}
	att.HostIfIndex, att.PodIfIndex = l.Attrs().Index, l.Attrs().ParentIndex
	return nil
}

// configurePodSide brings lo and the pod interface up and adds the addresses,
// gateway routes and gateway neighbour entries.
func configurePodSide(h *netlink.Handle, cfg PodConfig, att *Attachment) error {
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Index: att.PodIfIndex, Name: cfg.IfName}}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set link up: %w", err)
	}
	if err := h.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: loopbackIndex, Name: "lo"}}); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	for _, p := range cfg.Addrs {
		a := &netlink.Addr{IPNet: ipNet(p)}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD // the address is ours by IPAM; DAD would only delay it
		}
		if err := h.AddrAdd(link, a); err != nil {
			return fmt.Errorf("add address %s: %w", p, err)
		}
	}
	for _, gw := range gateways(cfg) {
		if gw.Is4() {
			// IPv4 needs the gateway on-link before it accepts it as a next
			// hop; for IPv6 a link-local next hop on a given device already is.
			r := &netlink.Route{LinkIndex: att.PodIfIndex, Dst: hostNet(gw), Scope: netlink.SCOPE_LINK}
			if err := h.RouteReplace(r); err != nil {
				return fmt.Errorf("add route to gateway %s: %w", gw, err)
			}
		}
		if err := h.RouteReplace(&netlink.Route{LinkIndex: att.PodIfIndex, Gw: gw.AsSlice()}); err != nil {
			return fmt.Errorf("add default route via %s: %w", gw, err)
		}
		if err := h.NeighSet(permanentNeigh(att.PodIfIndex, gw, att.HostMAC)); err != nil {
			return fmt.Errorf("add neighbour %s -> %s: %w", gw, att.HostMAC, err)
		}
	}
	return nil
}

// configureHostSide adds a host route and a neighbour entry per pod address.
// Replace, not add: a route left for this address by a dead pod must move.
func configureHostSide(h *netlink.Handle, cfg PodConfig, att *Attachment) error {
	for _, p := range cfg.Addrs {
		a := p.Addr()
		r := &netlink.Route{LinkIndex: att.HostIfIndex, Dst: hostNet(a), Scope: netlink.SCOPE_LINK}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("add host route to %s: %w", a, err)
		}
		if err := h.NeighSet(permanentNeigh(att.HostIfIndex, a, att.PodMAC)); err != nil {
			return fmt.Errorf("add host neighbour %s -> %s: %w", a, att.PodMAC, err)
		}
	}
	return nil
}

// gateways returns the gateway of each address family cfg uses.
func gateways(cfg PodConfig) []netip.Addr {
	var gws []netip.Addr
	if cfg.hasV4() {
		gws = append(gws, GatewayV4)
	}
	if cfg.hasV6() {
		gws = append(gws, GatewayV6)
	}
	return gws
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func permanentNeigh(ifindex int, ip netip.Addr, mac net.HardwareAddr) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex:    ifindex,
		Family:       family(ip),
		State:        netlink.NUD_PERMANENT,
		IP:           ip.AsSlice(),
		HardwareAddr: mac,
	}
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}
