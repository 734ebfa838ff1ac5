package dpapi

import (
	"net"
	"net/netip"
)

// Endpoint is a pod interface to enforce policy on.
type Endpoint struct {
	// Key is the stable attachment key "network/containerID/ifname".
	Key string
	// HostIfName and HostIfIndex name the host-side interface (veth peer).
	HostIfName  string
	HostIfIndex int
	// IPs are the pod's addresses on this interface.
	IPs []netip.Addr
	// Namespace and Labels determine the endpoint's identity.
	Namespace string
	Labels    map[string]string
	// Pod is "namespace/name" when known: SetPodNamedPorts names it.
	Pod string
	// HostMAC and PodMAC are the MACs of the host and pod ends of a veth
	// pair Coordino created (primary mode); with both set, host routing
	// delivers other nodes' pod traffic straight into the pod. Re-attaching
	// the same interface without them keeps the recorded ones.
	HostMAC, PodMAC net.HardwareAddr
}

// FullError is implemented by an error that says the datapath refused an
// endpoint because a table of fixed size is full: a limit that frees as pods
// leave, so the ADD that meets it may be retried. Its message names the
// table and, where there is one, the setting that raises it. Callers find it
// with errors.As.
type FullError interface {
	error
	DatapathFull()
}
