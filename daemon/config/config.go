package config

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/coordino/coordino/internal/process"
)

// Options configures one daemon. Directory options let several daemons
// share a machine (one per simulated node in tests).
type Options struct {
	Standalone  bool     `json:"standalone"`
	NodeName    string   `json:"nodeName"`
	PodCIDRs    []string `json:"podCIDRs"`
	RunDir      string   `json:"runDir"`
	StateDir    string   `json:"stateDir"`
	BPFDir      string   `json:"bpfDir"`
	MetricsAddr string   `json:"metricsAddr"`
	LogLevel    string   `json:"logLevel"`
	PolicyDir   string   `json:"policyDir"`
	AttachMode  string   `json:"attachMode"`
	// Datapath enforces policy: ebpf, nftables, or auto (eBPF, and
	// nftables where the kernel refuses the BPF programs).
	Datapath   string `json:"datapath"`
	NoDatapath bool   `json:"noDatapath"`
	FlowLog    string `json:"flowLog"`
	// ConntrackSize is the capacity of the datapath's conntrack table.
	ConntrackSize int `json:"conntrackSize"`
	// Capacities of the other BPF maps; 0 takes the datapath's default
	// (daemon/datapath/capacity.go), which validates them.
	EndpointsMapSize int `json:"endpointsMapSize"`
	IpcacheMapSize   int `json:"ipcacheMapSize"`
	PolicyMapSize    int `json:"policyMapSize"`
	SourceMapSize    int `json:"sourceMapSize"`
	FragMapSize      int `json:"fragMapSize"`
	// NodeIsolationMapSize holds NodeIsolationPolicy entries.
	NodeIsolationMapSize int `json:"nodeIsolationMapSize"`
	// Kubeconfig is the Kubernetes mode's API client config; empty means
	// in-cluster (service account) config.
	Kubeconfig string `json:"kubeconfig"`

	// Cross-node datapath (see daemon/routing, daemon/wireguard).
	Routing    string `json:"routing"`
	Encryption string `json:"encryption"`
	PeersFile  string `json:"peersFile"`
	// BGPConfig is the BGP speaker's file with --routing=bgp (the fields
	// of a BGPPeerPolicy's spec, see daemon/bgp).
	BGPConfig           string `json:"bgpConfig"`
	WireGuardDevice     string `json:"wireGuardDevice"`
	WireGuardPort       int    `json:"wireGuardPort"`
	WireGuardNodeToNode bool   `json:"wireGuardNodeToNode"`
	// WireGuardDeviceKind is auto (the kernel's device where the kernel has
	// WireGuard, else the userspace process), kernel, userspace or external
	// (a userspace device the coordino-wireguard DaemonSet runs).
	WireGuardDeviceKind string `json:"wireGuardDeviceKind"`
	// WireGuardKeyMaxAge rotates the WireGuard key when older (0: only on
	// request, by creating wireguard.rotate in the state dir).
	WireGuardKeyMaxAge time.Duration `json:"wireGuardKeyMaxAge"`
	// HostRouting is bpf (eBPF host routing of pod-to-pod traffic between
	// nodes) or legacy (the host's forwarding path).
	HostRouting string `json:"hostRouting"`
	// OTLPEndpoint receives OpenTelemetry traces; empty defers to OTEL_*.
	OTLPEndpoint string `json:"otlpEndpoint"`

	// Prefixes is PodCIDRs parsed.
	Prefixes []netip.Prefix `json:"-"`

	Services
	Masquerade
}

// Defaults are the production paths.
func Defaults() Options {
	return Options{
		RunDir:      "/run/coordino",
		StateDir:    "/var/lib/coordino",
		BPFDir:      "/sys/fs/bpf/coordino",
		MetricsAddr: "127.0.0.1:9962",
		LogLevel:    "info",
		AttachMode:  "tc",
		Datapath:    "auto",
		// Mirrors datapath.DefaultConntrackSize (config does not import the datapath).
		ConntrackSize: 1 << 18,

		Routing:             "direct",
		Encryption:          "none",
		WireGuardDevice:     "coordino-wg",
		WireGuardPort:       51871,
		WireGuardNodeToNode: true,
		WireGuardDeviceKind: "auto",
		HostRouting:         "bpf",

		Masquerade: Masquerade{Masquerade: true},
	}
}

type cidrList struct{ o *Options }

func (c cidrList) String() string {
	if c.o == nil {
		return ""
	}
	return strings.Join(c.o.PodCIDRs, ",")
}

func (c cidrList) Set(v string) error {
	c.o.PodCIDRs = append(c.o.PodCIDRs, v)
	return nil
}

// Parse reads args (without the program name). Errors name the flag or key.
func Parse(args []string, stderr io.Writer) (*Options, error) {
	o := Defaults()
	fs := flag.NewFlagSet("coordino-daemon", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configFile := fs.String("config", "", "JSON config file with the same keys as the flags (flags win)")
	fs.BoolVar(&o.Standalone, "standalone", false, "run without Kubernetes: static pod CIDRs and a policy directory")
	fs.StringVar(&o.NodeName, "node-name", "", "this node's name (default: $NODE_NAME, else the hostname)")
	fs.Var(cidrList{&o}, "pod-cidr", "a pod CIDR of this node, repeatable; one IPv4 and one IPv6 give dual-stack pods")
	fs.StringVar(&o.RunDir, "run-dir", o.RunDir, "socket, delete queue and netns pins")
	fs.StringVar(&o.StateDir, "state-dir", o.StateDir, "persistent state (endpoint store)")
	fs.StringVar(&o.BPFDir, "bpf-dir", o.BPFDir, "bpffs directory for pinned maps and links")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", o.MetricsAddr, "host:port or unix:/path for /metrics, /healthz, /readyz (port 0 picks one; written to <run-dir>/metrics.addr)")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, process.LevelUsage)
	fs.StringVar(&o.PolicyDir, "policy-dir", "", "standalone: directory of NetworkPolicy and Namespace YAML files")
	fs.StringVar(&o.AttachMode, "attach-mode", o.AttachMode, "how eBPF attaches to pod interfaces: tc (clsact + cls_bpf) or tcx (falls back to tc without kernel support)")
	fs.StringVar(&o.Datapath, "datapath", o.Datapath, "what enforces NetworkPolicy: ebpf, nftables (the inet coordino-policy table; no BPF at all), or auto (eBPF, falling back to nftables when the kernel refuses the BPF programs or has no bpffs)")
	fs.BoolVar(&o.NoDatapath, "no-datapath", false, "do not load eBPF: connectivity without policy enforcement")
	fs.StringVar(&o.FlowLog, "flow-log", "", "append flow events as JSON lines to this file (\"-\": stdout)")
	fs.IntVar(&o.ConntrackSize, "conntrack-size", o.ConntrackSize, "capacity of the eBPF conntrack table (flows of pods with an isolated direction; about 120 bytes each)")
	fs.IntVar(&o.EndpointsMapSize, "endpoints-map-size", 0, "capacity of the eBPF endpoints map, one entry per pod interface; when full, ADD fails with CNI code 11 (0: 65536, at most 65536)")
	fs.IntVar(&o.IpcacheMapSize, "ipcache-map-size", 0, "capacity of the eBPF ipcache (pod and node addresses, ipBlock prefixes); when full, what does not fit is denied, never allowed (0: 2097152)")
	fs.IntVar(&o.PolicyMapSize, "policy-map-size", 0, "capacity of the eBPF policy map; when full, policy updates fail closed and are retried (0: 1048576)")
	fs.IntVar(&o.SourceMapSize, "source-map-size", 0, "capacity of the eBPF source-address map, one entry per pod address; when full, ADD fails with CNI code 11 (0: 262144)")
	fs.IntVar(&o.FragMapSize, "frag-map-size", 0, "capacity of the eBPF IP fragment table (LRU; a later fragment whose first was evicted is dropped) (0: 16384)")
	fs.IntVar(&o.NodeIsolationMapSize, "node-isolation-map-size", 0, "capacity of the eBPF node isolation map (NodeIsolationPolicy ports; a port range takes up to 30 entries per protocol); when full, node isolation fails closed and is retried (0: 4096)")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "Kubernetes mode: kubeconfig file of the API client (default: in-cluster service account)")
	fs.StringVar(&o.Routing, "routing", o.Routing, "how pods reach pods on other nodes: direct (routes via peer node addresses), vxlan, or bgp (blocks announced to and learned from the fabric's routers, see --bgp-config)")
	fs.StringVar(&o.BGPConfig, "bgp-config", "", "with --routing=bgp: YAML/JSON file of the BGP speaker (localASN, peers; the spec of a BGPPeerPolicy)")
	fs.StringVar(&o.Encryption, "encryption", o.Encryption, "none, or wireguard (encrypts cross-node traffic; --routing is then not used)")
	fs.StringVar(&o.PeersFile, "peers-file", "", "standalone: YAML/JSON file of all nodes (addresses, blocks, WireGuard keys), watched for changes")
	fs.StringVar(&o.WireGuardDevice, "wireguard-device", o.WireGuardDevice, "WireGuard interface name (userspace devices share /var/run/wireguard: unique per host)")
	fs.IntVar(&o.WireGuardPort, "wireguard-port", o.WireGuardPort, "WireGuard UDP listen port")
	fs.BoolVar(&o.WireGuardNodeToNode, "wireguard-node-to-node", o.WireGuardNodeToNode, "also encrypt node-to-node traffic (needed for node-to-remote-pod traffic under encryption)")
	fs.StringVar(&o.WireGuardDeviceKind, "wireguard-device-kind", o.WireGuardDeviceKind, "auto (the kernel's WireGuard where it has the module, else the userspace coordino-wireguard process), kernel (fail without the module), userspace, or external (adopt the userspace device the coordino-wireguard DaemonSet runs, which outlives the daemon's pod)")
	fs.StringVar(&o.HostRouting, "host-routing", o.HostRouting, "bpf: pod-to-pod traffic between nodes skips the host's forwarding path (and its netfilter FORWARD) unless the host's conntrack tracks the flow; legacy: always the host's path")
	fs.DurationVar(&o.WireGuardKeyMaxAge, "wireguard-key-max-age", 0, "rotate the WireGuard key when it is older than this (0: only when <state-dir>/wireguard.rotate is created)")
	fs.StringVar(&o.OTLPEndpoint, "otlp-endpoint", "", "export OpenTelemetry traces of CNI verbs over OTLP/gRPC to host:port (plaintext) or a URL (https://…); default: the OTEL_EXPORTER_OTLP_* variables, else no tracing")
	o.Services.register(fs)
	o.Masquerade.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if *configFile != "" {
		merged, err := fromFile(*configFile)
		if err != nil {
			return nil, err
		}
		// Flags given on the command line override the file.
		explicit := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
		merged.applyFlags(&o, explicit)
		o = *merged
	}
	if o.NodeName == "" {
		o.NodeName = os.Getenv("NODE_NAME")
	}
	if o.NodeName == "" {
		o.NodeName, _ = os.Hostname()
	}
	return &o, o.validate()
}

func fromFile(path string) (*Options, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config %s: %w", path, err)
	}
	o := Defaults()
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return &o, nil
}

// applyFlags copies into o every option set explicitly on the command line.
func (o *Options) applyFlags(flags *Options, explicit map[string]bool) {
	set := map[string]func(){
		"standalone":              func() { o.Standalone = flags.Standalone },
		"node-name":               func() { o.NodeName = flags.NodeName },
		"pod-cidr":                func() { o.PodCIDRs = flags.PodCIDRs },
		"run-dir":                 func() { o.RunDir = flags.RunDir },
		"state-dir":               func() { o.StateDir = flags.StateDir },
		"bpf-dir":                 func() { o.BPFDir = flags.BPFDir },
		"metrics-addr":            func() { o.MetricsAddr = flags.MetricsAddr },
		"log-level":               func() { o.LogLevel = flags.LogLevel },
		"policy-dir":              func() { o.PolicyDir = flags.PolicyDir },
		"attach-mode":             func() { o.AttachMode = flags.AttachMode },
		"no-datapath":             func() { o.NoDatapath = flags.NoDatapath },
		"datapath":                func() { o.Datapath = flags.Datapath },
		"flow-log":                func() { o.FlowLog = flags.FlowLog },
		"kubeconfig":              func() { o.Kubeconfig = flags.Kubeconfig },
		"conntrack-size":          func() { o.ConntrackSize = flags.ConntrackSize },
		"otlp-endpoint":           func() { o.OTLPEndpoint = flags.OTLPEndpoint },
		"endpoints-map-size":      func() { o.EndpointsMapSize = flags.EndpointsMapSize },
		"ipcache-map-size":        func() { o.IpcacheMapSize = flags.IpcacheMapSize },
		"policy-map-size":         func() { o.PolicyMapSize = flags.PolicyMapSize },
		"source-map-size":         func() { o.SourceMapSize = flags.SourceMapSize },
		"frag-map-size":           func() { o.FragMapSize = flags.FragMapSize },
		"node-isolation-map-size": func() { o.NodeIsolationMapSize = flags.NodeIsolationMapSize },
		"routing":                 func() { o.Routing = flags.Routing },
		"encryption":              func() { o.Encryption = flags.Encryption },
		"peers-file":              func() { o.PeersFile = flags.PeersFile },
		"bgp-config":              func() { o.BGPConfig = flags.BGPConfig },
		"wireguard-device":        func() { o.WireGuardDevice = flags.WireGuardDevice },
		"wireguard-port":          func() { o.WireGuardPort = flags.WireGuardPort },
		"wireguard-node-to-node":  func() { o.WireGuardNodeToNode = flags.WireGuardNodeToNode },
		"wireguard-device-kind":   func() { o.WireGuardDeviceKind = flags.WireGuardDeviceKind },
		"host-routing":            func() { o.HostRouting = flags.HostRouting },
		"wireguard-key-max-age":   func() { o.WireGuardKeyMaxAge = flags.WireGuardKeyMaxAge },
	}
	o.Services.applyFlags(&flags.Services, set)
	o.Masquerade.applyFlags(&flags.Masquerade, set)
	for name := range explicit {
		if f := set[name]; f != nil {
			f()
		}
	}
}

func (o *Options) validate() error {
	o.Prefixes = o.Prefixes[:0]
	for _, c := range o.PodCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("pod-cidr %q: %w", c, err)
		}
		o.Prefixes = append(o.Prefixes, p.Masked())
	}
	if !o.Standalone && len(o.PodCIDRs) > 0 {
		return fmt.Errorf("pod-cidr is for --standalone only: in Kubernetes mode the node's blocks come from its NodeConfig")
	}
	if o.Standalone && o.Kubeconfig != "" {
		return fmt.Errorf("kubeconfig is for Kubernetes mode only: drop it or --standalone")
	}
	for name, dir := range map[string]string{"run-dir": o.RunDir, "state-dir": o.StateDir, "bpf-dir": o.BPFDir} {
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("%s %q must be an absolute path", name, dir)
		}
	}
	if o.Kubeconfig != "" && !filepath.IsAbs(o.Kubeconfig) {
		return fmt.Errorf("kubeconfig %q must be an absolute path", o.Kubeconfig)
	}
	if o.PolicyDir != "" && !filepath.IsAbs(o.PolicyDir) {
		return fmt.Errorf("policy-dir %q must be an absolute path", o.PolicyDir)
	}
	if err := process.ValidateAddr(o.MetricsAddr); err != nil {
		return err
	}
	if o.AttachMode != "tc" && o.AttachMode != "tcx" {
		return fmt.Errorf("attach-mode %q: want tc or tcx", o.AttachMode)
	}
	switch o.Datapath {
	case "ebpf", "nftables", "auto":
	default:
		return fmt.Errorf("datapath %q: want ebpf, nftables or auto", o.Datapath)
	}
	if err := o.validateCrossNode(); err != nil {
		return err
	}
	if err := o.Services.validate(); err != nil {
		return err
	}
	if err := o.Masquerade.validate(); err != nil {
		return err
	}
	_, err := process.ParseLevel(o.LogLevel)
	return err
}
