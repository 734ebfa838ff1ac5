package endpoint

import (
	"net"
	"net/netip"

	"github.com/coordino/coordino/daemon/chaining"
	"github.com/coordino/coordino/daemon/datapath/dpapi"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/store"
)

// The manager reaches the kernel, the datapath and the store only through
// the interfaces below, declared here by what the manager needs. Production
// wires Host, *datapath.Datapath and *store.Store (daemon/daemon.go); the
// package's tests wire fakes that record and fail on demand, so every undo
// path of ADD runs without root.

// Datapath enforces policy on the endpoints the manager attaches. It works
// on whole endpoints and names nothing of how it enforces (eBPF programs,
// nftables sets), so a second datapath implements it too. A nil Datapath in
// Config means none (--no-datapath): pods get connectivity without policy.
type Datapath interface {
	// AttachEndpoint starts enforcing on ep's host interface, or updates an
	// attached endpoint in place (same Key). A dpapi.FullError means the
	// datapath is at capacity.
	AttachEndpoint(ep dpapi.Endpoint) error
	// DetachEndpoint stops enforcing on the endpoint with ep.Key; detaching
	// an unknown key is not an error.
	DetachEndpoint(ep dpapi.Endpoint) error
	// Endpoints lists the keys of every attached endpoint, including those
	// a previous run of the daemon left.
	Endpoints() ([]string, error)
	// AttachCapacity fails when no further endpoint could be attached.
	AttachCapacity() error
}

// PodNetwork is the node's network as attachments touch it: the pod's
// network namespace and the interfaces on both sides of it.
type PodNetwork interface {
	Namespaces
	Links
}

// Namespaces checks and pins pod network namespaces (daemon/netns).
type Namespaces interface {
	// VerifyPodNetns fails unless path is a network namespace other than
	// the daemon's own.
	VerifyPodNetns(path string) error
	// VerifyPin fails unless pinPath still holds a network namespace.
	VerifyPin(pinPath string) error
	// Pin keeps the namespace at nsPath alive at pinPath (a bind mount).
	Pin(nsPath, pinPath string) error
	// Unpin removes a pin; an absent pin is not an error.
	Unpin(pinPath string) error
	// ListPins returns the pins under dir.
	ListPins(dir string) ([]string, error)
}

// Links sets up, checks and removes pod interfaces (daemon/netsetup), and
// finds the host side of interfaces another plugin made (daemon/chaining).
type Links interface {
	// SetupPod creates and configures a primary veth pair; on error nothing
	// it created remains.
	SetupPod(cfg netsetup.PodConfig) (*netsetup.Attachment, error)
	// TeardownPod deletes a primary host veth (and with it the pod end);
	// an absent veth is not an error.
	TeardownPod(hostIfName string) error
	// CheckPod reports how the veth pair differs from cfg.
	CheckPod(cfg netsetup.PodConfig) error
	// ListHostVeths returns the host veths that carry Coordino's names.
	ListHostVeths() ([]string, error)
	// ResolveHostPeer finds the host-side peer of the veth ifname in the
	// namespace at netnsPath, with the pod interface's addresses if asked.
	ResolveHostPeer(netnsPath, ifname string, podAddrs bool) (*chaining.HostPeer, error)
	// HostInterface returns the index and MAC of a host interface.
	HostInterface(name string) (index int, mac net.HardwareAddr, err error)
	// PodMACs returns the pod MAC of every primary veth, by host ifindex.
	PodMACs() (map[int]net.HardwareAddr, error)
}

// Store holds the endpoint records, the single source of truth
// (*store.Store).
type Store interface {
	Get(k store.Key) (*store.Endpoint, error)
	// Put writes ep durably and assigns its Generation if it has none.
	Put(ep *store.Endpoint) error
	Delete(k store.Key) error
	List(network string) ([]*store.Endpoint, error)
}

// ChainedNetworks hears of the networks chained attachments' pods sit on
// (the daemon's masquerade, which must not masquerade traffic to pods
// another plugin addressed). Keys are store.Key strings.
type ChainedNetworks interface {
	// LearnChained records key's networks (addresses with their prefix
	// length) and returns once they are in force.
	LearnChained(key string, networks []netip.Prefix)
	// ForgetChained drops key's; a network goes with its last attachment.
	ForgetChained(key string)
}
