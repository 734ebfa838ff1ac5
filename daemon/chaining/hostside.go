package chaining

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// errUndecided means the host-side lookup could not settle the question
// (no nsid for the pod's namespace, a kernel without IFLA_TARGET_NETNSID,
// an interface that is not there): the caller asks from inside the pod's
// namespace instead, which also words the error.
var errUndecided = errors.New("host-side lookup undecided")

// hostSocket returns one rtnetlink socket in the daemon's network
// namespace, opened on first use and shared (requests on it are
// serialized): a chained ADD then neither enters the pod's namespace nor
// opens a socket. A failed open is retried by the next call.
func hostSocket() (*nl.SocketHandle, error) {
	hostSock.mu.Lock()
	defer hostSock.mu.Unlock()
	if hostSock.sh != nil {
		return hostSock.sh, nil
	}
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	// The timeouts the library gives its own sockets: a request never hangs.
	if err := errors.Join(s.SetSendTimeout(&nl.SocketTimeoutTv), s.SetReceiveTimeout(&nl.SocketTimeoutTv)); err != nil {
		s.Close()
		return nil, err
	}
	hostSock.sh = &nl.SocketHandle{Socket: s}
	return hostSock.sh, nil
}

var hostSock struct {
	mu sync.Mutex
	sh *nl.SocketHandle
}

// resolveFromHost finds the host-side peer of the veth ifname in the
// namespace podNS without entering it: the pod interface is read through
// the host's nsid for podNS (RTM_GETLINK with IFLA_TARGET_NETNSID), and the
// link its IFLA_LINK names in the host is accepted only if it is a veth
// whose peer is that very interface in that very namespace (index and
// nsid), since an index alone names a link only within one namespace.
// It returns errUndecided when it cannot tell; an *ErrNotVeth is final.
func resolveFromHost(sh *nl.SocketHandle, podNS int, ifname string) (*HostPeer, error) {
	nsid, err := netnsID(sh, podNS)
	if err != nil || nsid < 0 {
		return nil, errUndecided
	}
	pod, err := getLink(sh, nsid, 0, ifname)
	if err != nil {
		return nil, errUndecided
	}
	if _, ok := pod.(*netlink.Veth); !ok {
		return nil, &ErrNotVeth{IfName: ifname, Kind: pod.Type()}
	}
	peerIndex := pod.Attrs().ParentIndex
	if peerIndex <= 0 {
		return nil, errUndecided
	}
	host, err := getLink(sh, -1, int32(peerIndex), "")
	if err != nil {
		return nil, errUndecided
	}
	if _, ok := host.(*netlink.Veth); !ok || host.Attrs().ParentIndex != pod.Attrs().Index || host.Attrs().NetNsID != int(nsid) {
		return nil, errUndecided
	}
	return &HostPeer{Name: host.Attrs().Name, Index: peerIndex}, nil
}

// netnsID is the host's nsid for the namespace open at fd, or -1 when it
// has none.
func netnsID(sh *nl.SocketHandle, fd int) (int32, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETNSID, unix.NLM_F_REQUEST)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: sh}
	req.AddData(nl.NewRtGenMsg())
	req.AddData(nl.NewRtAttr(unix.NETNSA_FD, nl.Uint32Attr(uint32(fd))))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNSID)
	if err != nil {
		return -1, err
	}
	for _, m := range msgs {
		// struct rtgenmsg (one byte, padded to 4), then the attributes.
		const rtgenLen = 4
		if len(m) < rtgenLen {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[rtgenLen:])
		if err != nil {
			return -1, err
		}
		for _, a := range attrs {
			if a.Attr.Type == unix.NETNSA_NSID && len(a.Value) == 4 {
				return int32(binary.NativeEndian.Uint32(a.Value)), nil
			}
		}
	}
	return -1, fmt.Errorf("RTM_GETNSID: no NETNSA_NSID in the reply")
}

// getLink asks for one link by index or name, in the host's namespace
// (nsid < 0) or in the namespace the host knows as nsid.
func getLink(sh *nl.SocketHandle, nsid, index int32, name string) (netlink.Link, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: sh}
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = index
	req.AddData(msg)
	if name != "" {
		req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	}
	if nsid >= 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_TARGET_NETNSID, nl.Uint32Attr(uint32(nsid))))
	}
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return nil, err
	}
	if len(msgs) != 1 {
		return nil, fmt.Errorf("RTM_GETLINK: %d replies", len(msgs))
	}
	return netlink.LinkDeserialize(nil, msgs[0])
}
