package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/coordino/coordino/daemon/ipam"
)

// Metrics holds the daemon's collectors.
type Metrics struct {
	Registry *prometheus.Registry
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	ready    atomic.Bool
}

// EndpointCounter counts stored endpoints by mode.
type EndpointCounter func() (map[string]int, error)

// New registers the CNI request metrics, IPAM usage of pool and endpoint counts.
func New(pool *ipam.Pool, endpoints EndpointCounter) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
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

// SetReady flips /readyz.
func (m *Metrics) SetReady(ready bool) { m.ready.Store(ready) }

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

// Serve starts the HTTP listener on addr ("127.0.0.1:0" picks a port;
// "unix:/path" serves on a root-only Unix socket) and returns its address. It stops when ctx is done.
func (m *Metrics) Serve(ctx context.Context, addr string) (net.Addr, error) {
	l, err := listen(addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !m.ready.Load() {
			http.Error(w, "not ready: restoring state", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the listener is gone; the daemon keeps serving CNI
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return l.Addr(), nil
}
