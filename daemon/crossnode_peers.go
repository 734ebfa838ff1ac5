package daemon

import (
	"net/netip"
	"slices"

	"go.uber.org/zap"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/coordino/coordino/api/client/clientset/versioned"
	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/k8s"
	"github.com/coordino/coordino/daemon/peers"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// crossNode is what the cross-node datapath shares with the rest of the
// daemon: the WireGuard identity the node publishes in its NodeConfig
// status.
type crossNode struct {
	// publishedKey is the public key peers must use (never the private
	// one): the next key once a rotation is prepared, so the node switches
	// when its own NodeConfig shows it. Nil without encryption.
	publishedKey  func() wgtypes.Key
	wireGuardPort int
	// st is what coordinoctl status shows.
	st *crossNodeStatus
}

// inspect reports the cross-node datapath to the inspection service.
func (x *crossNode) inspect() *inspectv1.CrossNode {
	key := ""
	if x.publishedKey != nil {
		key = x.publishedKey().String()
	}
	return x.st.status(key)
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

// wireGuardStatus is the node's WireGuard entry in its NodeConfig status:
// the public key and the endpoint on the node's first address; nil without
// encryption.
func (x *crossNode) wireGuardStatus(addrs []netip.Addr) *coordinov1alpha1.WireGuardStatus {
	if x == nil || x.publishedKey == nil {
		return nil
	}
	st := &coordinov1alpha1.WireGuardStatus{PublicKey: x.publishedKey().String()}
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
