package daemon

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/config"
	"github.com/coordino/coordino/daemon/masquerade"
	"github.com/coordino/coordino/daemon/peers"
	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

// masqRetry is how soon a failed masquerade update is tried again.
const masqRetry = 5 * time.Second

// masq feeds the masquerade table (daemon/masquerade) from what the daemon
// learns: the peer set (every node's blocks and addresses), the IPPools'
// natOutgoing and the Service ranges, and reports it.
type masq struct {
	o     *config.Options
	log   *zap.Logger
	table *masquerade.Table

	mu       sync.Mutex
	peers    peers.Set
	pools    poolNAT
	services []netip.Prefix // from the API (ServiceCIDR objects)
	// waiting: Kubernetes mode before the API's ranges came; nothing is
	// applied until then, so a pool with natOutgoing false is never
	// masqueraded for a moment (a table of an earlier run stays meanwhile).
	waiting bool
	chained chainedNets
	last    masquerade.Config
	problem string
}

// poolNAT is the IPPools' CIDRs by natOutgoing.
type poolNAT struct{ nat, exempt []netip.Prefix }

// startMasquerade returns the feeder; with --masquerade=false it removes
// the table an earlier run left, and returns one that only reports.
func startMasquerade(ctx context.Context, o *config.Options, log *zap.Logger) *masq {
	m := &masq{o: o, log: log.Named("masquerade"), table: &masquerade.Table{}, waiting: !o.Standalone}
	if !o.Masquerade.Masquerade {
		if err := m.table.Remove(); err != nil {
			m.log.Error("removing the masquerade table of an earlier run", zap.Error(err))
		}
		return m
	}
	go m.retry(ctx)
	return m
}

// retry re-applies after a failure until ctx is done.
func (m *masq) retry(ctx context.Context) {
	t := time.NewTicker(masqRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.mu.Lock()
			if m.problem != "" && !m.waiting {
				m.applyLocked()
			}
			m.mu.Unlock()
		}
	}
}

// setPeers is fed every applied peer set.
func (m *masq) setPeers(s peers.Set) {
	m.update(func() { m.peers = s })
}

// setRanges is fed the IPPools and the API's Service ranges (Kubernetes
// mode).
func (m *masq) setRanges(p poolNAT, services []netip.Prefix) {
	m.update(func() { m.pools, m.services, m.waiting = p, services, false })
}

func (m *masq) update(f func()) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	f()
	if m.o.Masquerade.Masquerade && !m.waiting {
		m.applyLocked()
	}
}

// config is what the table should hold: every pod CIDR this node knows of
// (its own, the peers' blocks, the IPPools) masqueraded unless its pool
// says natOutgoing false, toward anything but pod CIDRs, node addresses,
// Service ranges, the non-masquerade CIDRs and the networks of the chained
// attachments' pods. Callers hold mu.
func (m *masq) config() masquerade.Config {
	var c masquerade.Config
	c.Sources = append(c.Sources, m.o.Prefixes...)
	for _, n := range m.peers {
		c.Sources = append(c.Sources, n.Blocks...)
		for _, a := range n.Addresses {
			c.Cluster = append(c.Cluster, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	c.Sources = append(c.Sources, m.pools.nat...)
	c.Exempt = slices.Clone(m.pools.exempt)
	c.Cluster = append(c.Cluster, c.Sources...)
	c.Cluster = append(c.Cluster, c.Exempt...)
	c.Cluster = append(c.Cluster, m.serviceCIDRs()...)
	c.Cluster = append(c.Cluster, m.o.NonMasqueradePrefixes...)
	c.Cluster = append(c.Cluster, m.chained.networks()...)
	return c
}

// serviceCIDRs are the flag's and the API's Service ranges.
func (m *masq) serviceCIDRs() []netip.Prefix {
	return append(slices.Clone(m.o.ServicePrefixes), m.services...)
}

func (m *masq) applyLocked() {
	c := m.config()
	if err := m.table.Apply(c); err != nil {
		if m.problem == "" {
			m.log.Error("masquerade not updated; retrying", zap.Error(err))
		}
		m.problem = err.Error()
		return
	}
	if m.problem != "" {
		m.log.Info("masquerade updated after earlier failures")
	}
	m.problem, m.last = "", c
}

// inspect reports the masquerade for coordinoctl status.
func (m *masq) inspect() *inspectv1.Masquerade {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := &inspectv1.Masquerade{Enabled: m.o.Masquerade.Masquerade, Problem: m.problem}
	if !st.Enabled {
		return st
	}
	st.Sources = prefixStrings(m.last.Sources)
	st.Exempt = prefixStrings(m.last.Exempt)
	st.ServiceCidrs = prefixStrings(m.serviceCIDRs())
	st.NonMasqueradeCidrs = prefixStrings(m.o.NonMasqueradePrefixes)
	if cs, ok, err := m.table.Counters(); err != nil {
		st.Problem = err.Error()
	} else if ok {
		st.ConnectionsIpv4, st.ConnectionsIpv6 = cs.Connections["ipv4"], cs.Connections["ipv6"]
	}
	if ct, err := masquerade.ReadConntrackStats(); err == nil {
		st.ConntrackInsertFailed, st.ConntrackDrop = ct.InsertFailed, ct.Drop
	}
	return st
}

// prefixStrings are ps, merged where one holds another, as text.
func prefixStrings(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		if s := p.String(); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

var (
	masqConnsDesc = prometheus.NewDesc("coordino_masquerade_connections_total",
		"Connections masqueraded to the node's address on their way out of the cluster, by family, since the masquerade table was made.",
		[]string{"family"}, nil)
	masqUpToDateDesc = prometheus.NewDesc("coordino_masquerade_up_to_date",
		"1 when the masquerade table holds what the daemon last learnt, 0 while an update failed (retried); absent with --masquerade=false.",
		nil, nil)
	conntrackFailDesc = prometheus.NewDesc("coordino_conntrack_failures_total",
		"The host conntrack's failures in the node's network namespace: insert_failed (a NAT port clash or source-port exhaustion; the connection's first packet is dropped and retried by its sender), drop and early_drop (the table full).",
		[]string{"kind"}, nil)
)

// Describe implements prometheus.Collector.
func (m *masq) Describe(ch chan<- *prometheus.Desc) {
	ch <- masqConnsDesc
	ch <- masqUpToDateDesc
	ch <- conntrackFailDesc
}

// Collect implements prometheus.Collector.
func (m *masq) Collect(ch chan<- prometheus.Metric) {
	if ct, err := masquerade.ReadConntrackStats(); err == nil {
		for kind, v := range map[string]uint64{"insert_failed": ct.InsertFailed, "drop": ct.Drop, "early_drop": ct.EarlyDrop} {
			ch <- prometheus.MustNewConstMetric(conntrackFailDesc, prometheus.CounterValue, float64(v), kind)
		}
	}
	if !m.o.Masquerade.Masquerade {
		return
	}
	m.mu.Lock()
	upToDate := 1.0
	if m.problem != "" {
		upToDate = 0
	}
	m.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(masqUpToDateDesc, prometheus.GaugeValue, upToDate)
	if cs, ok, err := m.table.Counters(); err == nil && ok {
		for fam, v := range cs.Connections {
			ch <- prometheus.MustNewConstMetric(masqConnsDesc, prometheus.CounterValue, float64(v), fam)
		}
	}
}
