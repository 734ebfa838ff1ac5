package process

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server serves Registry's /metrics, /healthz (ok while the process runs)
// and /readyz (ok once SetReady(true), else 503 with NotReady).
type Server struct {
	Registry *prometheus.Registry
	// NotReady is /readyz's answer before the process is ready.
	NotReady string
	ready    atomic.Bool
}

// NewServer returns a server of a new registry; /readyz answers notReady
// until SetReady(true).
func NewServer(notReady string) *Server {
	return &Server{Registry: prometheus.NewRegistry(), NotReady: notReady}
}

// SetReady flips /readyz.
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// Serve starts the HTTP listener on addr ("127.0.0.1:0" picks a port;
// "unix:/path" serves on a root-only Unix socket) and returns its address.
// It stops when ctx is done.
func (s *Server) Serve(ctx context.Context, addr string) (net.Addr, error) {
	l, err := listen(addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "not ready: "+s.NotReady, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // the listener is gone; the process keeps doing its work
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
