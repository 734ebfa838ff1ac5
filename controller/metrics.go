package controller

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/coordino/coordino/internal/process"
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

// newServer serves the controller's metrics, /healthz and /readyz.
func newServer() *process.Server {
	s := process.NewServer("syncing caches")
	s.Registry.MustRegister(apiWrites, blocksAllocated, blocksReleased, poolExhaustion, identitiesAllocated, identitiesCollected, isLeader,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return s
}
