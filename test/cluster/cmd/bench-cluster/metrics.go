//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/coordino/coordino/test/cluster"
)

// sample is one Prometheus text-format sample.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics reads Prometheus text format (the subset exporters write:
// no escaped quotes in the label values we match on).
func parseMetrics(r io.Reader) ([]sample, error) {
	var out []sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(l, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[sp+1:], 64)
		if err != nil {
			continue
		}
		s := sample{name: l[:sp], labels: map[string]string{}, value: v}
		if i := strings.IndexByte(s.name, '{'); i >= 0 {
			for _, kv := range strings.Split(strings.TrimSuffix(s.name[i+1:], "}"), ",") {
				k, val, ok := strings.Cut(kv, "=")
				if ok {
					s.labels[k] = strings.Trim(val, `"`)
				}
			}
			s.name = s.name[:i]
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// histogram is a cumulative Prometheus histogram: count per upper bound.
type histogram map[float64]float64

// histogramOf sums the buckets of name over every sample whose labels
// match.
func histogramOf(samples []sample, name string, match map[string]string) histogram {
	h := histogram{}
next:
	for _, s := range samples {
		if s.name != name+"_bucket" {
			continue
		}
		for k, v := range match {
			if s.labels[k] != v {
				continue next
			}
		}
		le, err := strconv.ParseFloat(s.labels["le"], 64)
		if err != nil {
			continue
		}
		h[le] += s.value
	}
	return h
}

// minus is what was observed between two scrapes.
func (h histogram) minus(before histogram) histogram {
	d := histogram{}
	for le, n := range h {
		d[le] = n - before[le]
	}
	return d
}

func (h histogram) count() float64 { return h[math.Inf(1)] }

// quantile interpolates linearly inside the bucket holding rank q, as
// PromQL's histogram_quantile does. NaN without observations.
func (h histogram) quantile(q float64) float64 {
	total := h.count()
	if total == 0 {
		return math.NaN()
	}
	les := make([]float64, 0, len(h))
	for le := range h {
		les = append(les, le)
	}
	sort.Float64s(les)
	rank := q * total
	lower, below := 0.0, 0.0
	for _, le := range les {
		if h[le] >= rank {
			if math.IsInf(le, 1) {
				return lower
			}
			return lower + (le-lower)*(rank-below)/(h[le]-below)
		}
		lower, below = le, h[le]
	}
	return lower
}

// scrape is one round of metrics from every node: Coordino's daemons
// (absent with the reference CNI) and the kubelets through the API
// server's node proxy.
type scrape struct {
	daemon, kubelet []sample
}

func scrapeAll(ctx context.Context, c *cluster.Cluster, withDaemon bool) (scrape, error) {
	var s scrape
	hc := http.Client{Timeout: 10 * time.Second}
	for _, n := range c.Nodes {
		raw, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", n, "proxy", "metrics").DoRaw(ctx)
		if err != nil {
			return s, fmt.Errorf("kubelet metrics of %s: %w", n, err)
		}
		ks, err := parseMetrics(bytes.NewReader(raw))
		if err != nil {
			return s, err
		}
		s.kubelet = append(s.kubelet, ks...)
		if !withDaemon {
			continue
		}
		ip, err := c.NodeIP(n)
		if err != nil {
			return s, err
		}
		resp, err := hc.Get(fmt.Sprintf("http://%s:9190/metrics", ip))
		if err != nil {
			return s, fmt.Errorf("daemon metrics of %s: %w", n, err)
		}
		ds, err := parseMetrics(resp.Body)
		resp.Body.Close()
		if err != nil {
			return s, err
		}
		s.daemon = append(s.daemon, ds...)
	}
	return s, nil
}

// sum adds the values of name over samples whose labels match.
func sum(samples []sample, name string, match map[string]string) float64 {
	total := 0.0
next:
	for _, s := range samples {
		if s.name != name {
			continue
		}
		for k, v := range match {
			if s.labels[k] != v {
				continue next
			}
		}
		total += s.value
	}
	return total
}
