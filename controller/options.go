package controller

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/internal/process"
)

// IPAM modes.
const (
	// IPAMPools cuts blocks from IPPools (default).
	IPAMPools = "coordino"
	// IPAMKubernetes copies Node.spec.podCIDRs (kube-controller-manager's
	// allocator, managed clusters).
	IPAMKubernetes = "kubernetes"
)

// Options configure the controller; Parse reads them from flags.
type Options struct {
	Kubeconfig string // empty: in-cluster
	Namespace  string // of the leader Lease and the identity allocator ConfigMap
	// Identity of this replica in the Lease (default: hostname).
	ID                string
	LeaderElect       bool
	ReleaseLease      bool // give the Lease up on a clean exit (fast hand-over)
	LeaseDuration     time.Duration
	RenewDeadline     time.Duration
	RetryPeriod       time.Duration
	IPAM              string
	MinFreeAddresses  int // top up a node when fewer are free in a family
	IdentityGCGrace   time.Duration
	IdentityGCPeriod  time.Duration
	ExcludedLabels    []string
	IdentityBatch     int // identity numbers reserved per allocator write
	Workers           int
	MetricsAddr       string
	LogLevel          string
	ResyncPeriod      time.Duration
	ReleaseEmptyAfter time.Duration // an empty surplus block is released after this long
	// Client-side API rate limit (0: keep the client configuration's).
	// client-go's own default, 5/s, makes 500 new Nodes (three writes
	// each) wait five minutes for their blocks.
	KubeAPIQPS   float64
	KubeAPIBurst int
}

// DefaultOptions are the flag defaults.
func DefaultOptions() Options {
	return Options{
		Namespace:         "coordino-system",
		LeaderElect:       true,
		ReleaseLease:      true,
		LeaseDuration:     15 * time.Second,
		RenewDeadline:     10 * time.Second,
		RetryPeriod:       2 * time.Second,
		IPAM:              IPAMPools,
		MinFreeAddresses:  16,
		IdentityGCGrace:   15 * time.Minute,
		IdentityGCPeriod:  time.Minute,
		ExcludedLabels:    append([]string(nil), coordinov1alpha1.DefaultExcludedLabels...),
		IdentityBatch:     256,
		Workers:           4,
		MetricsAddr:       ":9963",
		LogLevel:          "info",
		ResyncPeriod:      10 * time.Minute,
		ReleaseEmptyAfter: time.Minute,
		KubeAPIQPS:        50,
		KubeAPIBurst:      100,
	}
}

// Parse reads flags into Options.
func Parse(args []string, out io.Writer) (Options, error) {
	o := DefaultOptions()
	fs := flag.NewFlagSet("coordino-controller", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "namespace of the leader election Lease and the identity allocator ConfigMap")
	fs.StringVar(&o.ID, "id", "", "this replica's leader election identity (default: hostname)")
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "elect a leader with a Lease; only the leader writes")
	fs.BoolVar(&o.ReleaseLease, "leader-elect-release", o.ReleaseLease, "release the Lease on a clean exit so a standby takes over at once")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", o.LeaseDuration, "leader Lease duration")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", o.RenewDeadline, "leader gives up when it cannot renew within this")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", o.RetryPeriod, "leader election retry period")
	fs.StringVar(&o.IPAM, "ipam", o.IPAM, "where node blocks come from: coordino (IPPools) or kubernetes (Node.spec.podCIDRs)")
	fs.IntVar(&o.MinFreeAddresses, "min-free-addresses", o.MinFreeAddresses, "add a block to a node when fewer addresses than this are free in an address family")
	fs.DurationVar(&o.ReleaseEmptyAfter, "release-empty-after", o.ReleaseEmptyAfter, "release a surplus block once it has been empty this long")
	fs.DurationVar(&o.IdentityGCGrace, "identity-gc-grace", o.IdentityGCGrace, "delete an Identity unused by any pod for this long")
	fs.DurationVar(&o.IdentityGCPeriod, "identity-gc-period", o.IdentityGCPeriod, "how often unused Identities are looked for")
	excl := fs.String("identity-exclude-labels", strings.Join(o.ExcludedLabels, ","), "pod label keys left out of identities (must match the daemons')")
	fs.IntVar(&o.IdentityBatch, "identity-batch", o.IdentityBatch, "identity numbers reserved per write of the allocator ConfigMap")
	fs.IntVar(&o.Workers, "workers", o.Workers, "concurrent node reconcilers")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", o.MetricsAddr, "listen address of /metrics, /healthz and /readyz (empty: off)")
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, process.LevelUsage)
	fs.Float64Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "API requests per second the controller may send (client-side limit)")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "API request burst above --kube-api-qps")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.ExcludedLabels = nil
	for _, k := range strings.Split(*excl, ",") {
		if k = strings.TrimSpace(k); k != "" {
			o.ExcludedLabels = append(o.ExcludedLabels, k)
		}
	}
	return o, o.Validate()
}

// Validate checks option values.
func (o *Options) Validate() error {
	var errs []error
	if o.IPAM != IPAMPools && o.IPAM != IPAMKubernetes {
		errs = append(errs, fmt.Errorf("--ipam: %q is neither %q nor %q", o.IPAM, IPAMPools, IPAMKubernetes))
	}
	if o.MinFreeAddresses < 1 {
		errs = append(errs, fmt.Errorf("--min-free-addresses: %d must be at least 1", o.MinFreeAddresses))
	}
	if o.IdentityBatch < 1 {
		errs = append(errs, fmt.Errorf("--identity-batch: %d must be at least 1", o.IdentityBatch))
	}
	if o.KubeAPIQPS < 0 || o.KubeAPIBurst < 0 {
		errs = append(errs, fmt.Errorf("--kube-api-qps %v, --kube-api-burst %d: must not be negative", o.KubeAPIQPS, o.KubeAPIBurst))
	}
	if o.Workers < 1 {
		errs = append(errs, fmt.Errorf("--workers: %d must be at least 1", o.Workers))
	}
	if o.LeaderElect && !(o.LeaseDuration > o.RenewDeadline && o.RenewDeadline > o.RetryPeriod) {
		errs = append(errs, errors.New("leader election needs lease duration > renew deadline > retry period"))
	}
	return errors.Join(errs...)
}
