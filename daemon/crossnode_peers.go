package daemon

import (
	"net/netip"
	"slices"
	"sync"

	"go.uber.org/zap"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/k8s"
	"github.com/coordino/coordino/daemon/peers"
)

// crossNode is what the cross-node datapath shares with the rest of the
// daemon: the WireGuard identity the node publishes in its NodeConfig
// status, and the other nodes' addresses, which the policy datapath gives
// the remote-node identity.
type crossNode struct {
	self string
	// wireGuardKey is the public key (never the private one); empty
	// without encryption.
	wireGuardKey  string
	wireGuardPort int

	mu    sync.Mutex
	nodes []netip.Addr
	sink  remoteNodeSink
	log   *zap.Logger
}

// remoteNodeSink is *datapath.Datapath.
type remoteNodeSink interface {
	SetRemoteNodes([]netip.Addr) error
}

// nodeConfigSource is the Kubernetes peer source: every node's NodeConfig.
func nodeConfigSource(o *config.Options, log *zap.Logger) (*peers.NodeConfigs, error) {
	rc, err := k8s.RestConfig(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cl, err := versioned.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &peers.NodeConfigs{Client: cl, Log: log}, nil
}

// setPeers records the other nodes' addresses from a new peer set.
func (x *crossNode) setPeers(s peers.Set) {
	var addrs []netip.Addr
	for name, n := range s {
		if name != x.self {
			addrs = append(addrs, n.Addresses...)
		}
	}
	slices.SortFunc(addrs, func(a, b netip.Addr) int { return a.Compare(b) })
	x.mu.Lock()
	defer x.mu.Unlock()
	x.nodes = addrs
	x.push()
}

// attach makes sink follow the remote node addresses from now on.
func (x *crossNode) attach(sink remoteNodeSink, log *zap.Logger) {
	if x == nil || sink == nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.sink, x.log = sink, log
	x.push()
}

func (x *crossNode) push() {
	if x.sink == nil {
		return
	}
	if err := x.sink.SetRemoteNodes(x.nodes); err != nil {
		x.log.Error("remote node addresses not fully in the ipcache", zap.Error(err))
	}
}

// wireGuardStatus is the node's WireGuard entry in its NodeConfig status:
// the public key and the endpoint on the node's first address; nil without
// encryption.
func (x *crossNode) wireGuardStatus(addrs []netip.Addr) *coordinov1alpha1.WireGuardStatus {
	if x == nil || x.wireGuardKey == "" {
		return nil
	}
	st := &coordinov1alpha1.WireGuardStatus{PublicKey: x.wireGuardKey}
	if len(addrs) > 0 {
		st.Endpoint = netip.AddrPortFrom(addrs[0], uint16(x.wireGuardPort)).String()
	}
	return st
}

// hasV6Block reports whether n hosts an IPv6 pod block.
func hasV6Block(n *peers.Node) bool {
	return n != nil && slices.ContainsFunc(n.Blocks, func(p netip.Prefix) bool { return p.Addr().Is6() })
}

// routable leaves out the other nodes that have published no address yet
// (a NodeConfig before its daemon's first status write): nothing can be
// routed to them, and they join with their first status.
func routable(s peers.Set, self string) peers.Set {
	out := make(peers.Set, len(s))
	for name, n := range s {
		if name == self || len(n.Addresses) > 0 {
			out[name] = n
		}
	}
	return out
}
