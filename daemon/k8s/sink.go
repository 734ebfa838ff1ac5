package k8s

import (
	"net/netip"

	"github.com/coordino/coordino/daemon/controlplane"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// Sink is what the datapath offers the Kubernetes source; *datapath.Datapath
// is one. Without a datapath, Discard takes everything; a sink that keeps
// only part embeds Discard and overrides the methods it cares about.
type Sink interface {
	controlplane.Sink

	// UpsertIdentity and DeleteIdentity announce and withdraw the
	// cluster's identities as policy peers.
	UpsertIdentity(identity.Identity) error
	DeleteIdentity(identity.ID) error

	// SetPodNamedPorts sets the named ports of this node's pod
	// "namespace/name" (nil: none), so rules naming ports resolve.
	SetPodNamedPorts(pod string, ports []policy.NamedPort) error

	// UpdateRemoteEndpoints gives the addresses of pods on other nodes with
	// their cluster identity, as deltas.
	UpdateRemoteEndpoints(upsert map[netip.Addr]identity.ID, remove []netip.Addr) error
	// RemoteEndpointsSynced says the deltas so far are the cluster's whole
	// remote view: what the sink kept from before a restart and was not
	// given again may go.
	RemoteEndpointsSynced() error
	// SetPeerNamedPorts sets the named ports of the remote pod key names
	// (nil: forget), so egress rules naming a port resolve against them.
	SetPeerNamedPorts(key string, id identity.ID, ports []policy.NamedPort) error
}

// Discard is the sink without a datapath (--no-datapath): it takes every
// update and keeps nothing.
type Discard struct{}

var _ Sink = Discard{}

func (Discard) UpdatePolicy(policy.Snapshot) error                                   { return nil }
func (Discard) UpsertIdentity(identity.Identity) error                               { return nil }
func (Discard) DeleteIdentity(identity.ID) error                                     { return nil }
func (Discard) SetPodNamedPorts(string, []policy.NamedPort) error                    { return nil }
func (Discard) UpdateRemoteEndpoints(map[netip.Addr]identity.ID, []netip.Addr) error { return nil }
func (Discard) RemoteEndpointsSynced() error                                         { return nil }
func (Discard) SetPeerNamedPorts(string, identity.ID, []policy.NamedPort) error      { return nil }
