package inspect

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"runtime/debug"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/flows"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/daemon/server"
	"github.com/coordino/coordino/daemon/store"
	flowv1 "github.com/coordino/coordino/proto/flow/v1"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// SocketName is the inspection socket's file name in the run dir.
const SocketName = "inspect.sock"

// Config wires the service to the daemon's state; everything is read only.
type Config struct {
	NodeName string
	// Standalone is the control-plane mode.
	Standalone bool
	// AttachMode is the configured datapath attach mode.
	AttachMode string
	// RunDir holds the delete queue.
	RunDir string
	// QueueDir is the plugin's on-disk DEL queue.
	QueueDir string
	Store    *store.Store
	Pool     *ipam.Pool
	// Datapath is the eBPF datapath: nil with nftables or --no-datapath.
	Datapath *datapath.Datapath
	// Policy is the datapath enforcing policy, either one: endpoints'
	// isolation and explain read it. Nil with --no-datapath.
	Policy PolicyView
	// NotEnforced, if set, says which policies the datapath leaves out
	// ("" when none): status reports it as a problem.
	NotEnforced func() string
	// DatapathKind is what enforces policy ("ebpf", "nftables", "none");
	// DatapathFallback why --datapath=auto did not take eBPF.
	DatapathKind, DatapathFallback string
	Hub                            *flows.Hub
	// CrossNode, if set, reports the cross-node datapath (routing,
	// encryption, peers and their WireGuard handshakes), whose state the
	// daemon's cross-node code owns.
	CrossNode func() *inspectv1.CrossNode
	// Masquerade, if set, reports the NAT of traffic leaving the cluster.
	Masquerade func() *inspectv1.Masquerade
	// KernelFeatures, if set, is the kernel feature table the daemon probed
	// at start; nil reports an empty table.
	KernelFeatures func() []*inspectv1.KernelFeature
	// Options is the daemon's effective configuration, for bug reports.
	Options any
	// Logs, if set, are the daemon's recent log lines, for bug reports.
	Logs *LogRing
	Log  *zap.Logger
}

// PolicyView is what endpoints and explain read of the datapath enforcing
// policy: *datapath.Datapath and *nftdp.Datapath decide a flow from what
// they enforce and name its rules with the same policy.Explainer.
type PolicyView interface {
	EndpointStates() []datapath.EndpointState
	Decide(hostIfIndex int, dir policy.Direction, peer netip.Addr, proto uint8, port uint16) (policy.Decision, error)
	Provenance(dec policy.Decision, dir policy.Direction, peer netip.Addr, proto uint8, port uint16) (selectedBy, allowedBy []string)
	DecidedBy(dec policy.Decision, dir policy.Direction, peer netip.Addr, proto uint8, port uint16) string
	DescribeIdentity(id identity.ID) string
	ServiceAddress(addr netip.Addr) bool
	ServiceTarget(addr netip.Addr, proto uint8, port uint16) bool
	ServiceHookError() error
}

var _ PolicyView = (*datapath.Datapath)(nil)

// Service implements coordino.inspect.v1.Inspector.
type Service struct {
	inspectv1.UnimplementedInspectorServer
	cfg     Config
	started time.Time
	history *history
}

// New returns the service; Run records recent drops until ctx ends.
func New(cfg Config) *Service {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Service{cfg: cfg, started: time.Now(), history: newHistory(historySize)}
}

// Serve listens on <run dir>/inspect.sock (0600, root and the daemon's user
// only) and serves the Inspector and the flow Observer until ctx ends.
func (s *Service) Serve(ctx context.Context) (stop func(), err error) {
	socket := filepath.Join(s.cfg.RunDir, SocketName)
	l, err := server.Listen(socket)
	if err != nil {
		return nil, err
	}
	g := grpc.NewServer(grpc.Creds(server.PeerCredentials(s.cfg.Log)))
	inspectv1.RegisterInspectorServer(g, s)
	if s.cfg.Hub != nil {
		flowv1.RegisterObserverServer(g, flows.NewService(s.cfg.Hub))
		s.history.follow(ctx, s.cfg.Hub)
	}
	go func() {
		if err := g.Serve(l); err != nil {
			s.cfg.Log.Error("inspection socket stopped", zap.Error(err))
		}
	}()
	s.cfg.Log.Info("serving inspection", zap.String("socket", socket))
	return func() { g.Stop(); _ = l.Close() }, nil
}

// Listen is server.Listen, re-exported for tests that serve on their own listener.
func Listen(socket string) (net.Listener, error) { return server.Listen(socket) }

// Version is the daemon's module version and VCS revision from build info.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "-dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		return fmt.Sprintf("%s (%s%s, %s)", v, rev, modified, bi.GoVersion)
	}
	return fmt.Sprintf("%s (%s)", v, bi.GoVersion)
}
