// Package metrics exposes the daemon's Prometheus metrics and its health
// endpoints (/metrics, /healthz, /readyz) on one HTTP listener.
package metrics
