package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

var (
	apiWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "coordino_controller_api_writes_total", Help: "API writes of the controller, by resource and verb."},
		[]string{"resource", "verb"})
	blocksAllocated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "coordino_controller_blocks_claimed_total", Help: "Blocks claimed for nodes."})
	blocksReleased = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "coordino_controller_blocks_released_total", Help: "Blocks given back by nodes or reclaimed from deleted nodes."})
	poolExhaustion = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "coordino_controller_pool_exhausted_total", Help: "Times a node needed a block and no pool had one."})
	identitiesAllocated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "coordino_controller_identities_created_total", Help: "Identities created."})
	identitiesCollected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "coordino_controller_identities_collected_total", Help: "Unused Identities deleted."})
	isLeader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "coordino_controller_leader", Help: "1 while this replica leads."})
)

// server serves /metrics, /healthz and /readyz.
type server struct {
	registry *prometheus.Registry
	ready    atomic.Bool
}

func newServer() *server {
	r := prometheus.NewRegistry()
	r.MustRegister(apiWrites, blocksAllocated, blocksReleased, poolExhaustion, identitiesAllocated, identitiesCollected, isLeader,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &server{registry: r}
}

// serve listens on addr until ctx is done and returns the bound address.
func (s *server) serve(ctx context.Context, addr string) (net.Addr, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready: syncing caches", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err
		}
	}()
	return l.Addr(), nil
}
