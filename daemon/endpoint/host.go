package endpoint

import (
	"net"

	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/daemon/chaining"
	"github.com/coordino/coordino/daemon/netns"
	"github.com/coordino/coordino/daemon/netsetup"
)

// Host is the PodNetwork of the node the daemon runs on: netns, netsetup,
// chaining and netlink, in the daemon's network namespace.
type Host struct{}

var _ PodNetwork = Host{}

// VerifyPodNetns refuses anything but a network namespace, and the daemon's
// own: a pod interface, address and default route put into the node's
// namespace would break the node.
func (Host) VerifyPodNetns(path string) error {
	if err := netns.Verify(path); err != nil {
		return err
	}
	return netns.RefuseOwn(path)
}

// VerifyPin implements Namespaces.
func (Host) VerifyPin(pinPath string) error { return netns.Verify(pinPath) }

// Pin implements Namespaces.
func (Host) Pin(nsPath, pinPath string) error { return netns.Pin(nsPath, pinPath) }

// Unpin implements Namespaces.
func (Host) Unpin(pinPath string) error { return netns.Unpin(pinPath) }

// ListPins implements Namespaces.
func (Host) ListPins(dir string) ([]string, error) { return netns.ListPins(dir) }

// SetupPod implements Links.
func (Host) SetupPod(cfg netsetup.PodConfig) (*netsetup.Attachment, error) {
	return netsetup.SetupPod(cfg)
}

// TeardownPod implements Links.
func (Host) TeardownPod(hostIfName string) error { return netsetup.TeardownPod(hostIfName) }

// CheckPod implements Links.
func (Host) CheckPod(cfg netsetup.PodConfig) error { return netsetup.CheckPod(cfg) }

// ListHostVeths implements Links.
func (Host) ListHostVeths() ([]string, error) { return netsetup.ListHostIfaces() }

// ResolveHostPeer implements Links.
func (Host) ResolveHostPeer(netnsPath, ifname string, podAddrs bool) (*chaining.HostPeer, error) {
	return chaining.ResolveHostPeer(netnsPath, ifname, podAddrs)
}

// HostInterface implements Links.
func (Host) HostInterface(name string) (int, net.HardwareAddr, error) {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return 0, nil, err
	}
	return link.Attrs().Index, link.Attrs().HardwareAddr, nil
}

// PodMACs reads the pod MAC of every primary veth from the host's permanent
// neighbour entries (netsetup writes one per pod address on the host end):
// one dump for all of them.
func (Host) PodMACs() (map[int]net.HardwareAddr, error) {
	neighs, err := netlink.NeighList(0, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	out := map[int]net.HardwareAddr{}
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT != 0 && len(n.HardwareAddr) == 6 {
			out[n.LinkIndex] = n.HardwareAddr
		}
	}
	return out, nil
}
