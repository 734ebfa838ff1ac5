package metrics

import (
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/coordino/coordino/proto/deletequeue"
)

// DeleteQueue counts the DELs waiting in the plugin's on-disk queue dir and
// the age of the oldest one. A missing dir is an empty queue.
func DeleteQueue(dir string) (n int, oldest time.Duration, err error) {
	paths, err := deletequeue.Paths(dir)
	if err != nil {
		return 0, 0, err
	}
	now := time.Now()
	for _, p := range paths {
		n++
		if info, err := os.Lstat(p); err == nil && now.Sub(info.ModTime()) > oldest {
			oldest = now.Sub(info.ModTime())
		}
	}
	return n, oldest, nil
}

var (
	queueDepthDesc = prometheus.NewDesc("coordino_delete_queue_depth",
		"DELs the plugin queued on disk while the daemon was unreachable, not yet applied.", nil, nil)
	queueAgeDesc = prometheus.NewDesc("coordino_delete_queue_oldest_age_seconds",
		"Age of the oldest queued DEL (0 when the queue is empty); the daemon drains the queue every 5 s.", nil, nil)
)

// NewDeleteQueueCollector reports the depth and oldest entry of the DEL queue in dir.
func NewDeleteQueueCollector(dir string) prometheus.Collector { return queueCollector(dir) }

type queueCollector string

func (c queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueDepthDesc
	ch <- queueAgeDesc
}

func (c queueCollector) Collect(ch chan<- prometheus.Metric) {
	n, oldest, err := DeleteQueue(string(c))
	if err != nil {
		ch <- prometheus.NewInvalidMetric(queueDepthDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(queueDepthDesc, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(queueAgeDesc, prometheus.GaugeValue, oldest.Seconds())
}

// MapUsage is the fill of one BPF map.
type MapUsage struct {
	Name              string
	Entries, Capacity int
}

var (
	mapEntriesDesc = prometheus.NewDesc("coordino_bpf_map_entries",
		"Entries in a BPF map of the datapath, by map.", []string{"map"}, nil)
	mapCapacityDesc = prometheus.NewDesc("coordino_bpf_map_capacity",
		"Maximum entries of a BPF map of the datapath, by map.", []string{"map"}, nil)
)

// NewMapCollector reports entries and capacity of each map usage returns.
func NewMapCollector(usage func() ([]MapUsage, error)) prometheus.Collector {
	return mapCollector(usage)
}

type mapCollector func() ([]MapUsage, error)

func (c mapCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- mapEntriesDesc
	ch <- mapCapacityDesc
}

func (c mapCollector) Collect(ch chan<- prometheus.Metric) {
	usage, err := c()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(mapEntriesDesc, err)
		return
	}
	for _, u := range usage {
		ch <- prometheus.MustNewConstMetric(mapEntriesDesc, prometheus.GaugeValue, float64(u.Entries), u.Name)
		ch <- prometheus.MustNewConstMetric(mapCapacityDesc, prometheus.GaugeValue, float64(u.Capacity), u.Name)
	}
}
