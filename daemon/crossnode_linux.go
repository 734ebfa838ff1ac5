package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/nodeaddrs"
	"github.com/coordino/coordino/daemon/peers"
	"github.com/coordino/coordino/daemon/routing"
	"github.com/coordino/coordino/daemon/wireguard"
)

// startCrossNode brings up the cross-node datapath (routing, or WireGuard
// when encryption is on), applies the peer set once (the start-up
// reconcile) and keeps applying it as the source changes until ctx is done.
// It returns what the pod MTU gives up for the tunnel, and the cross-node
// state the rest of the daemon publishes and consumes. onPeers sees every
// applied set (node isolation classifies the nodes' addresses with it).
func startCrossNode(ctx context.Context, o *config.Options, features *kernel.Features, log *zap.Logger, onPeers func(peers.Set)) (int, *crossNode, error) {
	log = log.Named("crossnode")
	xn := &crossNode{st: &crossNodeStatus{self: o.NodeName, routing: o.Routing, encryption: o.Encryption}}
	var src peers.Source = &peers.File{Path: o.PeersFile, Log: log}
	initial := peers.Set{}
	kubernetes := !o.Standalone
	if kubernetes {
		// NodeConfigs: the first set arrives from Run once the informer has
		// synced; until then the routes of a previous run stay as they are.
		nc, err := nodeConfigSource(o, log)
		if err != nil {
			return 0, nil, err
		}
		src = nc
		if addrs, err := nodeaddrs.List(); err == nil {
			initial[o.NodeName] = &peers.Node{Name: o.NodeName, Addresses: addrs}
		}
	} else if o.PeersFile != "" {
		// The file may appear later, its directory must exist to be watched.
		if fi, err := os.Stat(filepath.Dir(o.PeersFile)); err != nil || !fi.IsDir() {
			return 0, nil, fmt.Errorf("peers-file %s: its directory must exist to be watched", o.PeersFile)
		}
		s, err := src.(*peers.File).Load()
		if err != nil {
			return 0, nil, err
		}
		initial = s
	}
	underlayMTU := netsetup.DefaultMTU()
	encrypted := o.Encryption == "wireguard"
	overhead := routing.PodMTUOverhead(o.Routing, encrypted, routing.UnderlayIsV6(initial[o.NodeName]))

	var apply func(peers.Set) error
	if encrypted {
		dev, err := wireguard.Start(wireguard.Config{
			Self: o.NodeName, Device: o.WireGuardDevice, ListenPort: o.WireGuardPort,
			MTU: underlayMTU - routing.WireGuardOverhead, StateDir: o.StateDir, RunDir: o.RunDir,
			NodeToNode: o.WireGuardNodeToNode, KeyMaxAge: o.WireGuardKeyMaxAge, Kind: o.WireGuardDeviceKind,
			KernelWireGuard: features.Has(kernel.WireGuard),
			LogHandshakes:   o.LogLevel == "debug",
			// Rotated keys are published in wireguard.pub (standalone) and
			// through the NodeConfig status (publishedKey, polled).
		}, log)
		if err != nil {
			return 0, nil, err
		}
		xn.publishedKey, xn.wireGuardPort, xn.st.dev = dev.PublishedKey, o.WireGuardPort, dev
		go func() { <-ctx.Done(); dev.Close() }()
		go dev.Run(ctx)
		apply = dev.Apply
		if o.Routing == "bgp" {
			// The fabric learns this node's blocks and routes the
			// tunnel's endpoints; pods' traffic to other nodes stays in
			// the device.
			b, err := startBGP(ctx, o, nil, log)
			if err != nil {
				return 0, nil, err
			}
			apply, xn.st.bgp = b.applyEncrypted(dev.Apply), b
		}
	} else {
		if err := wireguard.RemoveStale(wireguard.Config{Device: o.WireGuardDevice, RunDir: o.RunDir}, log); err != nil {
			log.Error("removing WireGuard state of an earlier run", zap.Error(err))
		}
		mode := o.Routing
		if mode == "bgp" {
			// The router still removes what a direct or vxlan run left.
			mode = routing.Direct
		}
		r, err := routing.New(routing.Config{Mode: mode, Self: o.NodeName, UnderlayMTU: underlayMTU}, log)
		if err != nil {
			return 0, nil, err
		}
		apply = r.Apply
		if o.Routing == "bgp" {
			b, err := startBGP(ctx, o, r, log)
			if err != nil {
				return 0, nil, err
			}
			apply, xn.st.bgp = b.apply, b
		}
	}
	applyLogged := func(s peers.Set) {
		s = routable(s, o.NodeName)
		if kubernetes && hasV6Block(s[o.NodeName]) {
			// Blocks may arrive after start-up enabled forwarding for the
			// families it knew of then.
			if err := netsetup.EnableForwarding(true); err != nil {
				log.Error("enabling IPv6 forwarding for the node's IPv6 block", zap.Error(err))
			}
		}
		onPeers(s)
		err := apply(s)
		xn.st.setApplied(s)
		if err != nil {
			log.Error("cross-node datapath partly programmed", zap.Error(err))
			return
		}
		log.Info("cross-node datapath programmed", zap.Int("nodes", len(s)))
	}
	// The first apply is synchronous: stale routes of a previous run are
	// gone before pods are served. In Kubernetes mode that is the first set
	// from the API instead.
	if !kubernetes {
		applyLogged(initial)
	}
	if o.PeersFile != "" || kubernetes {
		go func() {
			if err := src.Run(ctx, applyLogged); err != nil {
				log.Error("peers source stopped", zap.Error(err))
			}
		}()
	}
	log.Info("cross-node datapath", zap.String("routing", o.Routing), zap.String("encryption", o.Encryption),
		zap.Int("podMTUOverhead", overhead), zap.String("peersFile", o.PeersFile))
	if overhead >= underlayMTU {
		return 0, nil, fmt.Errorf("underlay MTU %d leaves no room for a %d-byte tunnel overhead", underlayMTU, overhead)
	}
	return overhead, xn, nil
}
