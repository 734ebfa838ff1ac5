package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/controlplane"
	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/endpoint"
	"github.com/coordino/coordino/daemon/flows"
	"github.com/coordino/coordino/daemon/inspect"
	"github.com/coordino/coordino/daemon/k8s"
	"github.com/coordino/coordino/daemon/kernel"
	"github.com/coordino/coordino/daemon/metrics"
	"github.com/coordino/coordino/daemon/nftdp"
	"github.com/coordino/coordino/daemon/nodeaddrs"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/daemon/routewatch"
)

// bpffsRoot is where hosts normally mount the BPF filesystem.
const bpffsRoot = "/sys/fs/bpf"

// enforcer is what the daemon needs of the datapath enforcing policy,
// whichever it is: the endpoint manager's seam, the Kubernetes source's
// sink, the node's addresses (the host identity) and this node's
// endpoints for publishing. *datapath.Datapath and *nftdp.Datapath are
// enforcers.
type enforcer interface {
	endpoint.Datapath
	k8s.Sink
	SetNodeIPs([]netip.Addr) error
	localPublisher
}

var (
	_ enforcer = (*datapath.Datapath)(nil)
	_ enforcer = (*nftdp.Datapath)(nil)
	// Both explain flows (coordinoctl policy explain) and report flows.
	_ inspect.PolicyView = (*nftdp.Datapath)(nil)
	_ flowSource         = (*nftdp.Datapath)(nil)
	_ flowSource         = (*datapath.Datapath)(nil)
)

// datapathChoice says which datapath enforces policy on this node and, when
// --datapath=auto did not take eBPF, why.
type datapathChoice struct {
	kind     string // "ebpf", "nftables" or "none"
	fallback string
}

// openEBPF opens the eBPF datapath; tests replace it to make the load fail.
var openEBPF = datapath.Open

// startEBPF loads (or adopts) the eBPF datapath and starts the policy
// source; it returns once the first policy snapshot is in the maps, so no
// pod attached afterwards is ever unprotected. A *datapath.LoadError says
// the kernel (or a missing bpffs) refused it before anything started.
// serviceCIDRs are the Service ranges known at start (the API's, else the
// flag's).
func startEBPF(ctx context.Context, o *config.Options, features *kernel.Features, m *metrics.Metrics, hub *flows.Hub, log *zap.Logger, kube *k8s.Source, serviceCIDRs []netip.Prefix) (_ *datapath.Datapath, err error) {
	// Many hosts do not mount bpffs; pins elsewhere are the operator's business.
	if strings.HasPrefix(filepath.Clean(o.BPFDir)+"/", bpffsRoot+"/") {
		if err := datapath.MountBPFFS(bpffsRoot); err != nil {
			return nil, &datapath.LoadError{Err: err}
		}
	}
	nodeIPs, err := nodeaddrs.List()
	if err != nil {
		return nil, err
	}
	dp, err := openEBPF(datapath.Config{BPFDir: o.BPFDir, AttachMode: datapath.AttachMode(o.AttachMode), Logger: log, NodeIPs: nodeIPs,
		ConntrackSize: o.ConntrackSize, Identities: identityAssigner(kube),
		MapSizes: datapath.MapSizes{Endpoints: o.EndpointsMapSize, Ipcache: o.IpcacheMapSize, Policy: o.PolicyMapSize,
			SourceAddrs: o.SourceMapSize, Frags: o.FragMapSize, NodeIsolation: o.NodeIsolationMapSize},
		ServiceCIDRs: serviceCIDRs, NoServiceHook: o.NoServiceHook, Features: features})
	if err != nil {
		return nil, err
	}
	// One cleanup for every failure below: the pins stay, so a later start
	// adopts what this one wrote.
	defer func() {
		if err != nil {
			dp.Close()
		}
	}()
	if err := m.Register(dp.Collectors()...); err != nil {
		return nil, err
	}
	if err := feedPolicy(ctx, o, dp, nodeIPs, m, log, kube); err != nil {
		return nil, err
	}
	// Host routing's programs remember the FIB's answers per flow: a change
	// to where packets go must reach them at once.
	forget := func() {
		if err := dp.ForgetNextHops(); err != nil {
			log.Error("host routing: next hops stay cached for up to a second", zap.Error(err))
		}
	}
	if err := routewatch.Watch(ctx, netns.None(), forget, log); err != nil {
		return nil, err
	}
	if err := startFlows(ctx, o.FlowLog, dp, hub, log); err != nil {
		return nil, err
	}
	return dp, nil
}

// startNFTables opens (or adopts) the nftables datapath and starts the
// policy source; like startEBPF it returns once the first policy is in
// force.
func startNFTables(ctx context.Context, o *config.Options, m *metrics.Metrics, hub *flows.Hub, log *zap.Logger, kube *k8s.Source) (*nftdp.Datapath, error) {
	nodeIPs, err := nodeaddrs.List()
	if err != nil {
		return nil, err
	}
	dp, err := nftdp.Open(nftdp.Config{StateDir: filepath.Join(o.StateDir, "nftables"), NodeIPs: nodeIPs,
		Identities: identityAssigner(kube), Logger: log})
	if err != nil {
		return nil, err
	}
	if err := m.Register(dp.Collectors()...); err != nil {
		return nil, err
	}
	if err := feedPolicy(ctx, o, dp, nodeIPs, m, log, kube); err != nil {
		return nil, err
	}
	if err := startFlows(ctx, o.FlowLog, dp, hub, log); err != nil {
		return nil, err
	}
	return dp, nil
}

// flowSource is a datapath reporting flows: *datapath.Datapath and
// *nftdp.Datapath feed the same stream.
type flowSource interface {
	SetEmitAllowed(on bool) error
	ReadFlows(ctx context.Context, fn func(datapath.Flow)) error
}

// feedPolicy starts the policy source into dp, whichever datapath it is,
// and returns once the first snapshot is applied; then it keeps the node's
// addresses (the host identity) current.
func feedPolicy(ctx context.Context, o *config.Options, dp enforcer, nodeIPs []netip.Addr, m *metrics.Metrics, log *zap.Logger, kube *k8s.Source) error {
	if kube == nil {
		// No remote source will confirm what a Kubernetes-mode run left.
		if err := dp.RemoteEndpointsSynced(); err != nil {
			return err
		}
	}
	if kube != nil {
		if err := runSource[k8s.Sink](ctx, kube, dp, log); err != nil {
			return err
		}
	} else if o.PolicyDir == "" {
		if err := dp.UpdatePolicy(policy.Snapshot{}); err != nil {
			return err
		}
	} else if err := startPolicySource(ctx, o.PolicyDir, o.StateDir, dp, m, log); err != nil {
		return err
	}
	// A chained primary's bridge gateway, for one, appears only at its
	// first ADD, and traffic from it (kubelet probes) must stay allowed.
	return nodeaddrs.Watch(ctx, netns.None(), nodeIPs, dp.SetNodeIPs, log)
}

func startPolicySource(ctx context.Context, dir, stateDir string, sink controlplane.Sink, m *metrics.Metrics, log *zap.Logger) error {
	src := controlplane.NewStandalone(dir, log.Named("policy"))
	// The last valid version of each file outlives restarts (a file broken at
	// start-up keeps its protection).
	src.StateDir = filepath.Join(stateDir, "policy-last-valid")
	if err := m.Register(src.Collectors()...); err != nil {
		return err
	}
	if err := runSource[controlplane.Sink](ctx, src, sink, log); err != nil {
		return fmt.Errorf("policy dir %s: %w", dir, err)
	}
	return nil
}

// startFlows runs the datapath's single flow-event reader, publishing to
// hub (gRPC FollowFlows clients) and, when path is set, appending JSON lines
// to it ("-" is stdout). Drops are always reported; allowed flows only while
// the log is configured or a FollowFlows client wants them, since reporting
// each one costs every new connection (docs/benchmarks.md, "How we got here").
func startFlows(ctx context.Context, path string, dp flowSource, hub *flows.Hub, log *zap.Logger) error {
	publish := hub.Publish
	if path == "" {
		hub.OnAllowedDemand(func(want bool) {
			if err := dp.SetEmitAllowed(want); err != nil {
				log.Error("switch allowed-flow events", zap.Bool("on", want), zap.Error(err))
			}
		})
		// Clients leaving during shutdown must not touch a closed datapath.
		context.AfterFunc(ctx, func() { hub.OnAllowedDemand(nil) })
	} else {
		if err := dp.SetEmitAllowed(true); err != nil {
			return err
		}
		w := os.Stdout
		if path != "-" {
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
			if err != nil {
				return fmt.Errorf("open flow log %s: %w", path, err)
			}
			w = f
			go func() { <-ctx.Done(); f.Close() }()
		}
		writeLine := datapath.JSONLines(w)
		publish = func(f datapath.Flow) { writeLine(f); hub.Publish(f) }
	}
	go func() {
		if err := dp.ReadFlows(ctx, publish); err != nil && ctx.Err() == nil {
			log.Error("flow events stopped", zap.Error(err))
		}
	}()
	return nil
}

// registerChoice exports which datapath enforces policy, and whether
// --datapath=auto fell back from eBPF, as coordino_datapath_info.
func (p *parts) registerChoice() {
	if p.choice.kind == "" {
		return // start failed before a choice
	}
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "coordino_datapath_info",
		Help: "1 for the datapath enforcing policy on this node (ebpf, nftables, none); fallback is true when --datapath=auto could not load eBPF (the reason is in the log and coordinoctl status).",
	}, []string{"datapath", "fallback"})
	g.WithLabelValues(p.choice.kind, strconv.FormatBool(p.choice.fallback != "")).Set(1)
	if err := p.m.Register(g); err != nil {
		p.log.Error("datapath metric not registered", zap.Error(err))
	}
}
