package kernel

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Name names a feature.
type Name string

// The features probed, in the order they are shown.
const (
	TCX             Name = "tcx"
	NetfilterLink   Name = "bpf-netfilter-link"
	DynptrFromSkb   Name = "kfunc bpf_dynptr_from_skb"
	CTLookup        Name = "kfunc bpf_skb_ct_lookup"
	MapSumElemCount Name = "kfunc bpf_map_sum_elem_count"
	RedirectPeer    Name = "helper bpf_redirect_peer"
	RedirectNeigh   Name = "helper bpf_redirect_neigh"
	DecapFlags      Name = "bpf_skb_adjust_room decap flags"
	XTBPFMatch      Name = "nftables xt_bpf match"
	Netkit          Name = "netkit"
	WireGuard       Name = "wireguard"
	VXLAN           Name = "vxlan"
	SCTP            Name = "sctp"
)

// Feature is one row of the table.
type Feature struct {
	Name      Name
	Available bool
	// Detail says how it was found (built in, module loaded, ...) or why not.
	Detail string
	// Effect says what Coordino does without it; empty when available.
	Effect string
}

// Features is the probed table. The zero value has nothing available.
type Features struct {
	list []Feature
}

// Has reports whether the feature n is available.
func (f *Features) Has(n Name) bool {
	if f == nil {
		return false
	}
	i := slices.IndexFunc(f.list, func(x Feature) bool { return x.Name == n })
	return i >= 0 && f.list[i].Available
}

// List returns the table's rows, in probe order.
func (f *Features) List() []Feature {
	if f == nil {
		return nil
	}
	return slices.Clone(f.list)
}

// Without returns a copy of f in which the features names are unavailable,
// as if the kernel lacked them: how tests take a fallback on a kernel that
// would not need it.
func (f *Features) Without(names ...Name) *Features {
	out := &Features{list: f.List()}
	for i := range out.list {
		if slices.Contains(names, out.list[i].Name) && out.list[i].Available {
			out.list[i].Available = false
			out.list[i].Detail = "disabled by configuration (" + out.list[i].Detail + ")"
			out.list[i].Effect = effects[out.list[i].Name]
		}
	}
	return out
}

// Log writes the table once: one line, every feature a field.
func (f *Features) Log(log *zap.Logger) {
	fields := make([]zap.Field, 0, len(f.list))
	missing := 0
	for _, x := range f.list {
		v := "yes: " + x.Detail
		if !x.Available {
			v = "no: " + x.Detail + "; " + x.Effect
			missing++
		}
		fields = append(fields, zap.String(string(x.Name), v))
	}
	log.Info("kernel features", append(fields, zap.Int("missing", missing))...)
}

var featureDesc = prometheus.NewDesc("coordino_kernel_feature",
	"Whether the running kernel offers a feature the datapath may use (1) or not (0); see docs/kernels.md.",
	[]string{"feature"}, nil)

// Collector exports the table as coordino_kernel_feature{feature}.
func (f *Features) Collector() prometheus.Collector { return collector{f} }

type collector struct{ f *Features }

func (c collector) Describe(ch chan<- *prometheus.Desc) { ch <- featureDesc }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for _, x := range c.f.list {
		v := 0.0
		if x.Available {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(featureDesc, prometheus.GaugeValue, v, string(x.Name))
	}
}

// effects says, per feature, what Coordino does on a kernel without it.
var effects = map[Name]string{
	TCX:             "endpoints attach with clsact + cls_bpf (--attach-mode=tcx falls back)",
	NetfilterLink:   "Service traffic of egress-isolated pods is decided after DNAT by the nftables xt_bpf stage instead",
	DynptrFromSkb:   "as without bpf-netfilter-link: the post-DNAT program cannot read packets",
	CTLookup:        "eBPF host routing's fast path stays off: pod traffic between nodes takes the host's forwarding path (load nf_conntrack before the daemon to have it)",
	MapSumElemCount: "the conntrack table's entry count is read by walking it",
	RedirectPeer:    "eBPF host routing stays off (--host-routing=legacy)",
	RedirectNeigh:   "eBPF host routing stays off (--host-routing=legacy)",
	DecapFlags:      "in vxlan routing the VXLAN device decapsulates other nodes' pod packets (the host's path) instead of eBPF host routing",
	XTBPFMatch:      "without bpf-netfilter-link too, new flows of egress-isolated pods to Service CIDRs are dropped (fail closed)",
	Netkit:          "none: pods use veth pairs",
	WireGuard:       "--encryption=wireguard runs the userspace coordino-wireguard process",
	VXLAN:           "--routing=vxlan cannot create its device",
	SCTP:            "none: the kernel carries no SCTP, so no SCTP flow needs policy",
}

// row builds a table row for n from a probe's answer.
func row(n Name, available bool, detail string) Feature {
	x := Feature{Name: n, Available: available, Detail: detail}
	if !available {
		x.Effect = effects[n]
	}
	return x
}
