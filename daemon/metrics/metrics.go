package metrics

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/coordino/coordino/daemon/ipam"
	"github.com/coordino/coordino/internal/process"
)

// Metrics holds the daemon's collectors; its Server serves them with
// /healthz and /readyz.
type Metrics struct {
	*process.Server
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
}

// EndpointCounter counts stored endpoints by mode.
type EndpointCounter func() (map[string]int, error)

// New registers the CNI request metrics, IPAM usage of pool and endpoint counts.
func New(pool *ipam.Pool, endpoints EndpointCounter) *Metrics {
	m := &Metrics{
		Server: process.NewServer("restoring state"),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "coordino_cni_request_duration_seconds",
			Help:    "Time the daemon spent serving a CNI verb, by verb and CNI result code (0: success).",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"verb", "code"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "coordino_cni_errors_total",
			Help: "CNI verbs that returned an error, by verb and CNI error code.",
		}, []string{"verb", "code"}),
	}
	m.Registry.MustRegister(m.duration, m.errors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&ipamCollector{pool: pool}, &endpointCollector{count: endpoints})
	return m
}

// ObserveRequest records one served verb; code 0 means success.
func (m *Metrics) ObserveRequest(verb string, took time.Duration, code uint) {
	c := strconv.FormatUint(uint64(code), 10)
	m.duration.WithLabelValues(verb, c).Observe(took.Seconds())
	if code != 0 {
		m.errors.WithLabelValues(verb, c).Inc()
	}
}

var (
	ipamDesc       = prometheus.NewDesc("coordino_ipam_addresses", "Pod addresses per block, by family (ipv4, ipv6) and state (used, free).", []string{"block", "family", "state"}, nil)
	ipamBlocksDesc = prometheus.NewDesc("coordino_ipam_blocks", "Address blocks of this node, by family (ipv4, ipv6).", []string{"family"}, nil)
)

type ipamCollector struct{ pool *ipam.Pool }

func (c *ipamCollector) Describe(ch chan<- *prometheus.Desc) { ch <- ipamDesc; ch <- ipamBlocksDesc }

func (c *ipamCollector) Collect(ch chan<- prometheus.Metric) {
	blocks := map[string]int{"ipv4": 0, "ipv6": 0}
	for _, u := range c.pool.Usage() {
		family := "ipv6"
		if u.Prefix.Addr().Is4() {
			family = "ipv4"
		}
		blocks[family]++
		ch <- prometheus.MustNewConstMetric(ipamDesc, prometheus.GaugeValue, float64(u.Used), u.Prefix.String(), family, "used")
		ch <- prometheus.MustNewConstMetric(ipamDesc, prometheus.GaugeValue, float64(u.Size-u.Used), u.Prefix.String(), family, "free")
	}
	for family, n := range blocks {
		ch <- prometheus.MustNewConstMetric(ipamBlocksDesc, prometheus.GaugeValue, float64(n), family)
	}
}

var endpointsDesc = prometheus.NewDesc("coordino_endpoints", "Pod attachments in the endpoint store, by mode.", []string{"mode"}, nil)

type endpointCollector struct{ count EndpointCounter }

func (c *endpointCollector) Describe(ch chan<- *prometheus.Desc) { ch <- endpointsDesc }

func (c *endpointCollector) Collect(ch chan<- prometheus.Metric) {
	counts, err := c.count()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(endpointsDesc, err)
		return
	}
	for _, mode := range []string{"primary", "chained"} {
		ch <- prometheus.MustNewConstMetric(endpointsDesc, prometheus.GaugeValue, float64(counts[mode]), mode)
	}
}

// Register adds collectors of other parts of the daemon.
func (m *Metrics) Register(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := m.Registry.Register(c); err != nil {
			return fmt.Errorf("register collector: %w", err)
		}
	}
	return nil
}
