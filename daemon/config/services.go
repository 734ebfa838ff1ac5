package config

import (
	"flag"
	"fmt"
	"net/netip"
	"strings"
)

// Services configures policy for traffic addressed to Services (see
// docs/policy.md, "Services").
type Services struct {
	// ServiceCIDRs are the cluster's Service ranges (kube-apiserver's
	// --service-cluster-ip-range), comma-separated or repeated.
	ServiceCIDRs []string `json:"serviceCIDRs"`
	// NoServiceHook keeps the post-DNAT hook detached: Service traffic of
	// egress-isolated pods is dropped, as on kernels without BPF netfilter
	// links.
	NoServiceHook bool `json:"noServiceHook"`

	// ServicePrefixes is ServiceCIDRs parsed.
	ServicePrefixes []netip.Prefix `json:"-"`
}

// listFlag is a flag of comma-separated values that may also repeat.
type listFlag struct{ p *[]string }

func (c listFlag) String() string {
	if c.p == nil {
		return ""
	}
	return strings.Join(*c.p, ",")
}

func (c listFlag) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*c.p = append(*c.p, p)
		}
	}
	return nil
}

// parsePrefixes parses CIDRs (host bits dropped); errors name the flag.
func parsePrefixes(flag string, cidrs []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", flag, c, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func (s *Services) register(fs *flag.FlagSet) {
	fs.Var(listFlag{&s.ServiceCIDRs}, "service-cidrs", "the cluster's Service CIDRs (comma-separated or repeated, at most 64): egress policy of new flows to them is decided on the backend kube-proxy translates to; in Kubernetes mode the ServiceCIDR objects of the API are added to them")
	fs.BoolVar(&s.NoServiceHook, "no-service-hook", false, "do not attach the post-DNAT netfilter hook: Service traffic of egress-isolated pods is dropped (what kernels without BPF netfilter links get)")
}

func (s *Services) applyFlags(flags *Services, set map[string]func()) {
	set["service-cidrs"] = func() { s.ServiceCIDRs = flags.ServiceCIDRs }
	set["no-service-hook"] = func() { s.NoServiceHook = flags.NoServiceHook }
}

// MaxServiceCIDRs is the capacity of the datapath's Service CIDR map
// (cdo_svc_cidrs in bpf/lib/service.h): more would fail the datapath's open.
const MaxServiceCIDRs = 64

func (s *Services) validate() error {
	var err error
	if s.ServicePrefixes, err = parsePrefixes("service-cidrs", s.ServiceCIDRs); err != nil {
		return err
	}
	distinct := map[netip.Prefix]bool{}
	for _, p := range s.ServicePrefixes {
		distinct[p] = true
	}
	if len(distinct) > MaxServiceCIDRs {
		return fmt.Errorf("service-cidrs: %d ranges, at most %d", len(distinct), MaxServiceCIDRs)
	}
	return nil
}
