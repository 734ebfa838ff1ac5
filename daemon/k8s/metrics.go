package k8s

import "github.com/prometheus/client_golang/prometheus"

// sourceMetrics are the source's Prometheus collectors.
type sourceMetrics struct {
	unseenPods, statusWrites, endpointWrites prometheus.Counter
	live, temporary, remote                  prometheus.GaugeFunc
}

// newSourceMetrics builds the collectors; the gauges read s when scraped.
func newSourceMetrics(s *Source) sourceMetrics {
	return sourceMetrics{
		unseenPods: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordino_k8s_pod_label_misses_total",
			Help: "ADDs refused (try again later) because the pod was not in the daemon's cache within the bounded wait."}),
		statusWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordino_k8s_status_writes_total", Help: "NodeConfig status updates written."}),
		endpointWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "coordino_k8s_node_endpoints_writes_total", Help: "NodeEndpoints writes (create or update) of this node."}),
		live: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "coordino_k8s_live",
			Help: "1 while the daemon's view comes from synced informers, 0 while it serves from the last-known state."},
			func() float64 {
				if s.view().live() {
					return 1
				}
				return 0
			}),
		remote: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "coordino_remote_endpoints",
			Help: "Pod addresses on other nodes known with their identity (from NodeEndpoints)."},
			func() float64 { return float64(s.remoteCount.Load()) }),
		temporary: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "coordino_identities_temporary",
			Help: "Node-local temporary identities held by endpoints whose label set has no cluster Identity yet."},
			func() float64 { return float64(s.ids.Temporary()) }),
	}
}

func (m sourceMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.unseenPods, m.live, m.temporary, m.statusWrites, m.endpointWrites, m.remote}
}
