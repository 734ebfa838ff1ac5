package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/netsetup"
	"github.com/coordino/coordino/daemon/peers"
	"github.com/coordino/coordino/daemon/routing"
	"github.com/coordino/coordino/daemon/wireguard"
)

// startCrossNode brings up the cross-node datapath (routing, or WireGuard
// when encryption is on), applies the peer set once (the start-up
// reconcile) and keeps applying it as the source changes until ctx is done.
// It returns what the pod MTU gives up for the tunnel. onPeers sees every
// applied set (node isolation classifies the nodes' addresses with it).
func startCrossNode(ctx context.Context, o *config.Options, log *zap.Logger, onPeers func(peers.Set)) (int, error) {
	log = log.Named("crossnode")
	// Standalone source. Kubernetes mode plugs peers.NodeConfigs in here
	// (its first set arrives from Run rather than from Load).
	src := &peers.File{Path: o.PeersFile, Log: log}
	initial := peers.Set{}
	if o.PeersFile != "" {
		// The file may appear later, its directory must exist to be watched.
		if fi, err := os.Stat(filepath.Dir(o.PeersFile)); err != nil || !fi.IsDir() {
			return 0, fmt.Errorf("peers-file %s: its directory must exist to be watched", o.PeersFile)
		}
		s, err := src.Load()
		if err != nil {
			return 0, err
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
			NodeToNode: o.WireGuardNodeToNode, KeyMaxAge: o.WireGuardKeyMaxAge,
			// Standalone publishes rotated keys in wireguard.pub; Kubernetes
			// mode sets OnPublicKey to write NodeConfig status.
		}, log)
		if err != nil {
			return 0, err
		}
		go func() { <-ctx.Done(); dev.Close() }()
		go dev.Run(ctx)
		apply = dev.Apply
	} else {
		if err := wireguard.RemoveStale(wireguard.Config{Device: o.WireGuardDevice, RunDir: o.RunDir}, log); err != nil {
			log.Error("removing WireGuard state of an earlier run", zap.Error(err))
		}
		r, err := routing.New(routing.Config{Mode: o.Routing, Self: o.NodeName, UnderlayMTU: underlayMTU}, log)
		if err != nil {
			return 0, err
		}
		apply = r.Apply
	}
	applyLogged := func(s peers.Set) {
		onPeers(s)
		if err := apply(s); err != nil {
			log.Error("cross-node datapath partly programmed", zap.Error(err))
			return
		}
		log.Info("cross-node datapath programmed", zap.Int("nodes", len(s)))
	}
	// The first apply is synchronous: stale routes of a previous run are
	// gone before pods are served.
	applyLogged(initial)
	if o.PeersFile != "" {
		go func() {
			if err := src.Run(ctx, applyLogged); err != nil {
				log.Error("peers source stopped", zap.Error(err))
			}
		}()
	}
	log.Info("cross-node datapath", zap.String("routing", o.Routing), zap.String("encryption", o.Encryption),
		zap.Int("podMTUOverhead", overhead), zap.String("peersFile", o.PeersFile))
	if overhead >= underlayMTU {
		return 0, fmt.Errorf("underlay MTU %d leaves no room for a %d-byte tunnel overhead", underlayMTU, overhead)
	}
	return overhead, nil
}
