package datapath

import (
	"github.com/coordino/coordino/bpf"
	"github.com/prometheus/client_golang/prometheus"
)

// reasonNames index bpf reason values; keep in sync with enum reason.
var reasonNames = [...]string{
	bpf.CoordinoReasonREASON_POLICY:         "policy",
	bpf.CoordinoReasonREASON_NOT_ISOLATED:   "not-isolated",
	bpf.CoordinoReasonREASON_HOST:           "host",
	bpf.CoordinoReasonREASON_ESTABLISHED:    "established",
	bpf.CoordinoReasonREASON_REPLY:          "reply",
	bpf.CoordinoReasonREASON_RELATED:        "related",
	bpf.CoordinoReasonREASON_NOT_IP:         "not-ip",
	bpf.CoordinoReasonREASON_NEIGHBOR:       "neighbor-discovery",
	bpf.CoordinoReasonREASON_POLICY_DENIED:  "policy-denied",
	bpf.CoordinoReasonREASON_POLICY_REVOKED: "policy-revoked",
	bpf.CoordinoReasonREASON_NO_ENDPOINT:    "no-endpoint",
	bpf.CoordinoReasonREASON_MALFORMED:      "malformed",
	bpf.CoordinoReasonREASON_SPOOFED:        "spoofed",
	bpf.CoordinoReasonREASON_FRAGMENT:       "fragment-unknown",
	// The slots between named reasons are counter-only (events lost).
	bpf.CoordinoReasonREASON_NODE_ISOLATED:         "node-isolated",
	bpf.CoordinoReasonREASON_NODE_TO_NODE_DENIED:   "node-to-node-denied",
	bpf.CoordinoReasonREASON_SERVICE_UNENFORCEABLE: "service-unenforceable",
	bpf.CoordinoReasonREASON_TUNNEL_INJECTION:      "tunnel-injection",
	bpf.CoordinoReasonREASON_ADMIN_DENY:            "admin-deny",
	bpf.CoordinoReasonREASON_BASELINE_DENY:         "baseline-deny",
}

// ReasonServiceUnenforceable is the drop reason of Service traffic that
// cannot be decided after DNAT (no post-DNAT hook).
const ReasonServiceUnenforceable = uint8(bpf.CoordinoReasonREASON_SERVICE_UNENFORCEABLE)

// ReasonName names a verdict reason as used in metrics and flow events.
func ReasonName(r uint8) string {
	if int(r) < len(reasonNames) && reasonNames[r] != "" {
		return reasonNames[r]
	}
	return "unknown"
}

// Verdict returns "allowed" or "dropped" for a reason.
func Verdict(r uint8) string {
	if r >= uint8(bpf.CoordinoReasonREASON_FIRST_DROP) {
		return "dropped"
	}
	return "allowed"
}

var (
	packetsDesc = prometheus.NewDesc("coordino_datapath_packets_total",
		"Packets seen by the endpoint programs, by direction (of the pod), verdict and reason.",
		[]string{"direction", "verdict", "reason"}, nil)
	bytesDesc = prometheus.NewDesc("coordino_datapath_bytes_total",
		"Bytes seen by the endpoint programs, by direction (of the pod), verdict and reason.",
		[]string{"direction", "verdict", "reason"}, nil)
	lostDesc = prometheus.NewDesc("coordino_flow_events_lost_total",
		"Flow events dropped because the ring buffer was full.", nil, nil)
	suppressedDesc = prometheus.NewDesc("coordino_flow_events_suppressed_total",
		"Drop events not reported because of the per-CPU drop event rate limit (the packets are still counted).", nil, nil)
	endpointsDesc = prometheus.NewDesc("coordino_datapath_endpoints",
		"Endpoints with attached programs.", nil, nil)
	policyEntriesDesc = prometheus.NewDesc("coordino_policy_map_entries",
		"Entries in the BPF policy map.", nil, nil)
	revisionDesc = prometheus.NewDesc("coordino_policy_revision",
		"Policy revision last written to the datapath.", nil, nil)
)

type metrics struct {
	d             *Datapath
	invalidPolicy prometheus.Gauge
	policies      prometheus.Gauge
}

func newMetrics(d *Datapath) *metrics {
	m := &metrics{d: d, invalidPolicy: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "coordino_policy_invalid",
		Help: "Network policies skipped by the last compilation because they are invalid.",
	}), policies: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "coordino_policies",
		Help: "Valid network policies in the policy engine (the last snapshot applied).",
	})}
	return m
}

func (m *metrics) setCompileError(err error) {
	n := 0
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		n = len(u.Unwrap())
	} else if err != nil {
		n = 1
	}
	m.invalidPolicy.Set(float64(n))
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{packetsDesc, bytesDesc, lostDesc, suppressedDesc, endpointsDesc, policyEntriesDesc, revisionDesc} {
		ch <- d
	}
	describeConntrack(ch)
	ch <- hostRouteDesc
}

// Collect reads the per-CPU counters from the kernel at scrape time.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	var lost, suppressed uint64
	for dir := range uint32(2) {
		dirName := "ingress"
		if dir == 1 {
			dirName = "egress"
		}
		for reason := range uint32(len(reasonNames)) {
			if reasonNames[reason] == "" { // counter-only slots
				continue
			}
			pkts, bytes, err := m.counter(dir, reason)
			if err != nil {
				continue
			}
			r := uint8(reason)
			ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(pkts), dirName, Verdict(r), ReasonName(r))
			ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.CounterValue, float64(bytes), dirName, Verdict(r), ReasonName(r))
		}
		n, _, _ := m.counter(dir, uint32(bpf.CoordinoReasonREASON_EVENT_LOST))
		lost += n
		n, _, _ = m.counter(dir, uint32(bpf.CoordinoReasonREASON_EVENT_SUPPRESSED))
		suppressed += n
	}
	ch <- prometheus.MustNewConstMetric(lostDesc, prometheus.CounterValue, float64(lost))
	ch <- prometheus.MustNewConstMetric(suppressedDesc, prometheus.CounterValue, float64(suppressed))
	m.d.mu.Lock()
	eps, entries, rev := m.d.eps.count(), m.d.mw.usage()[2].Entries, m.d.mw.policyRevision()
	m.d.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(endpointsDesc, prometheus.GaugeValue, float64(eps))
	ch <- prometheus.MustNewConstMetric(policyEntriesDesc, prometheus.GaugeValue, float64(entries))
	ch <- prometheus.MustNewConstMetric(revisionDesc, prometheus.GaugeValue, float64(rev))
	m.d.ct.collect(ch)
	m.d.hr.collect(ch)
}

// counter sums one verdict counter slot over all CPUs.
func (m *metrics) counter(dir, reason uint32) (packets, bytes uint64, err error) {
	var perCPU []bpf.CoordinoCounter
	if err := m.d.objs.CdoVerdicts.Lookup(dir*uint32(bpf.CoordinoReasonREASON_SLOTS)+reason, &perCPU); err != nil {
		return 0, 0, err
	}
	for _, c := range perCPU {
		packets += c.Packets
		bytes += c.Bytes
	}
	return packets, bytes, nil
}

// Collectors returns the datapath's Prometheus collectors: packet and byte
// counters by direction, verdict and reason, and policy state gauges.
func (d *Datapath) Collectors() []prometheus.Collector {
	return append([]prometheus.Collector{d.metrics, d.metrics.invalidPolicy, d.mw.syncFailures, d.metrics.policies, d.health.failures},
		d.ct.collectors()...)
}
