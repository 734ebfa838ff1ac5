package chaining

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/privileged"
)

func newTestNS(t *testing.T) (ns.NetNS, *netlink.Handle) {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(); _ = testutils.UnmountNS(n) })
	h, err := netlink.NewHandleAt(netns.NsHandle(n.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return n, h
}

func socketIn(t *testing.T, n ns.NetNS) *nl.SocketHandle {
	t.Helper()
	s, err := nl.GetNetlinkSocketAt(netns.NsHandle(n.Fd()), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &nl.SocketHandle{Socket: s}
}

// moveLink moves the link named name from the namespace of h into to,
// where it takes the index newIndex (IFLA_NEW_IFINDEX).
func moveLink(t *testing.T, from ns.NetNS, h *netlink.Handle, name string, to ns.NetNS, newIndex int) {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: socketIn(t, from)}
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(l.Attrs().Index)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(to.Fd()))))
	req.AddData(nl.NewRtAttr(unix.IFLA_NEW_IFINDEX, nl.Uint32Attr(uint32(newIndex))))
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		t.Fatalf("move %s to index %d: %v", name, newIndex, err)
	}
}

// TestResolveFromHost checks the host-side lookup a chained ADD makes: it
// finds the host end of the pod's veth without entering the pod's
// namespace, refuses a non-veth pod interface, and refuses a host veth
// whose indexes match the pod's pair but whose peer lives in another
// namespace (the index of a link means something only within one).
func TestResolveFromHost(t *testing.T) {
	privileged.Require(t)
	host, hostH := newTestNS(t)
	sh := socketIn(t, host)

	t.Run("peer in the host", func(t *testing.T) {
		pod, podH := newTestNS(t)
		if err := podH.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "vethhost0",
			PeerNamespace: netlink.NsFd(host.Fd())}); err != nil {
			t.Fatal(err)
		}
		want, err := hostH.LinkByName("vethhost0")
		if err != nil {
			t.Fatal(err)
		}
		peer, err := resolveFromHost(sh, int(pod.Fd()), "eth0")
		if err != nil {
			t.Fatal(err)
		}
		if peer.Name != "vethhost0" || peer.Index != want.Attrs().Index {
			t.Fatalf("resolved %+v, want vethhost0 at index %d", peer, want.Attrs().Index)
		}
		if _, err := resolveFromHost(sh, int(pod.Fd()), "eth9"); !errors.Is(err, errUndecided) {
			t.Fatalf("missing pod interface: %v, want errUndecided (the pod-side lookup words the error)", err)
		}
	})

	t.Run("not a veth", func(t *testing.T) {
		pod, podH := newTestNS(t)
		if err := podH.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}}); err != nil {
			t.Fatal(err)
		}
		if err := hostH.SetNetNsIdByFd(int(pod.Fd()), -1); err != nil {
			t.Fatal(err)
		}
		_, err := resolveFromHost(sh, int(pod.Fd()), "eth0")
		var nv *ErrNotVeth
		if !errors.As(err, &nv) || nv.Kind != "bridge" {
			t.Fatalf("bridge as pod interface: %v, want ErrNotVeth", err)
		}
	})

	t.Run("look-alike peer in another namespace", func(t *testing.T) {
		// The pod's eth0 (index 2000) has its peer at index 2001 in
		// namespace other; the host's decoy (index 2001) has its peer at
		// index 2000 in namespace third. Indexes agree, namespaces do not.
		pod, podH := newTestNS(t)
		other, _ := newTestNS(t)
		third, _ := newTestNS(t)
		if err := podH.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", Index: 2000}, PeerName: "o0"}); err != nil {
			t.Fatal(err)
		}
		moveLink(t, pod, podH, "o0", other, 2001)
		if err := hostH.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "decoy0", Index: 2001}, PeerName: "t0"}); err != nil {
			t.Fatal(err)
		}
		moveLink(t, host, hostH, "t0", third, 2000)
		// The host knows the pod's namespace by an nsid, as it does once any
		// link of the host has had its peer there.
		if err := hostH.SetNetNsIdByFd(int(pod.Fd()), -1); err != nil {
			t.Fatal(err)
		}
		decoy, err := hostH.LinkByName("decoy0")
		if err != nil {
			t.Fatal(err)
		}
		if decoy.Attrs().Index != 2001 || decoy.Attrs().ParentIndex != 2000 {
			t.Fatalf("decoy at index %d, peer index %d: set-up wrong", decoy.Attrs().Index, decoy.Attrs().ParentIndex)
		}
		peer, err := resolveFromHost(sh, int(pod.Fd()), "eth0")
		if !errors.Is(err, errUndecided) {
			t.Fatalf("resolved %+v (err %v): a veth whose peer is in another namespace was taken for the pod's", peer, err)
		}
	})
}

// BenchmarkResolveHostPeer compares the host-side lookup of a chained ADD
// with the lookup from inside the pod's namespace (its fallback), on a
// veth whose host end is in this process's namespace.
func BenchmarkResolveHostPeer(b *testing.B) {
	privileged.Require(b)
	pod, err := testutils.NewNS()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { pod.Close(); _ = testutils.UnmountNS(pod) }()
	hostName := fmt.Sprintf("cbr%08x", rand.Uint32())
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostName}, PeerName: "tmp" + hostName[3:]}); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = netlink.LinkDel(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: hostName}}) }()
	podEnd, err := netlink.LinkByName("tmp" + hostName[3:])
	if err != nil {
		b.Fatal(err)
	}
	if err := netlink.LinkSetNsFd(podEnd, int(pod.Fd())); err != nil {
		b.Fatal(err)
	}
	if err := pod.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("tmp" + hostName[3:])
		if err != nil {
			return err
		}
		return netlink.LinkSetName(l, "eth0")
	}); err != nil {
		b.Fatal(err)
	}
	b.Run("host-side", func(b *testing.B) {
		for b.Loop() {
			if peer, err := ResolveHostPeer(pod.Path(), "eth0", false); err != nil || peer.Name != hostName {
				b.Fatalf("%+v, %v", peer, err)
			}
		}
	})
	b.Run("pod-side", func(b *testing.B) {
		for b.Loop() {
			podNS, err := netns.GetFromPath(pod.Path())
			if err != nil {
				b.Fatal(err)
			}
			peer, err := resolveInPodNetns(podNS, pod.Path(), "eth0", false)
			podNS.Close()
			if err != nil || peer.Name != hostName {
				b.Fatalf("%+v, %v", peer, err)
			}
		}
	})
}
