package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/stats"
)

// Report is the outcome of one run; -json prints it as is.
type Report struct {
	Date     string   `json:"date"`
	Machine  Machine  `json:"machine"`
	Params   Params   `json:"params"`
	Duration string   `json:"duration"`
	Rows     []Row    `json:"rows"`
	Targets  []Target `json:"targets"`
}

// Machine describes where the numbers come from.
type Machine struct {
	CPUs   int    `json:"cpus"`
	Kernel string `json:"kernel"`
	Model  string `json:"cpuModel"`
}

// Row is one configuration: per-round samples and their medians.
type Row struct {
	System string `json:"system"`
	Label  string `json:"label"`
	Rules  int    `json:"rulesPerEnd"`
	// ClusterPolicies are the ClusterNetworkPolicies loaded besides.
	ClusterPolicies int `json:"clusterPolicies,omitempty"`
	// PolicyEntries counts Coordino policy-map entries, or nft rules.
	PolicyEntries int       `json:"policyEntries"`
	Gbps          []float64 `json:"gbps"`
	ConnPerSec    []float64 `json:"connPerSec"`
	ConnErrors    int       `json:"connErrors"`
	MedianGbps    float64   `json:"medianGbps"`
	MedianConn    float64   `json:"medianConnPerSec"`
	// Ratios are relative to the baseline (bare) row's medians.
	GbpsRatio float64 `json:"gbpsRatio"`
	ConnRatio float64 `json:"connRatio"`
}

// Target is one goal of issue 4 and whether this run met it.
type Target struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Met   bool    `json:"met"`
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "model name") {
				if _, v, ok := strings.Cut(l, ":"); ok {
					m.Model = strings.TrimSpace(v)
				}
				break
			}
		}
	}
	return m
}

// finish computes medians, ratios and targets.
func (r *Report) finish(rows []Row, took time.Duration) {
	r.Duration = took.Round(time.Second).String()
	for i := range rows {
		rows[i].MedianGbps = stats.Median(rows[i].Gbps)
		rows[i].MedianConn = stats.Median(rows[i].ConnPerSec)
	}
	base := rows[0]
	for i := range rows {
		if base.MedianGbps > 0 {
			rows[i].GbpsRatio = rows[i].MedianGbps / base.MedianGbps
		}
		if base.MedianConn > 0 {
			rows[i].ConnRatio = rows[i].MedianConn / base.MedianConn
		}
	}
	r.Rows = rows
	var lo, hi, cluster, none *Row
	for i := range rows {
		if rows[i].System == "coordino" && rows[i].Rules == 0 {
			none = &rows[i]
		}
		if rows[i].ClusterPolicies > 0 {
			cluster = &rows[i]
		}
		if rows[i].System != "coordino" || rows[i].Rules == 0 || rows[i].ClusterPolicies > 0 {
			continue
		}
		if lo == nil || rows[i].Rules < lo.Rules {
			lo = &rows[i]
		}
		if hi == nil || rows[i].Rules > hi.Rules {
			hi = &rows[i]
		}
	}
	if lo == nil {
		return
	}
	flat := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	gFlat, cFlat := flat(hi.MedianGbps, lo.MedianGbps), flat(hi.MedianConn, lo.MedianConn)
	r.Targets = []Target{
		{fmt.Sprintf("Coordino throughput at %d rules ≥ 95%% of no policy", hi.Rules), hi.GbpsRatio, hi.GbpsRatio >= 0.95},
		{fmt.Sprintf("Coordino connection rate at %d rules ≥ 95%% of no policy", hi.Rules), hi.ConnRatio, hi.ConnRatio >= 0.95},
		{fmt.Sprintf("Coordino throughput flat from %d to %d rules (±5%%)", lo.Rules, hi.Rules), gFlat, gFlat >= 0.95 && gFlat <= 1.05},
		{fmt.Sprintf("Coordino connection rate flat from %d to %d rules (±5%%)", lo.Rules, hi.Rules), cFlat, cFlat >= 0.95 && cFlat <= 1.05},
	}
	if cluster != nil && none != nil {
		c := flat(cluster.MedianConn, none.MedianConn)
		r.Targets = append(r.Targets, Target{fmt.Sprintf("Coordino connection rate with %d rules and %d ClusterNetworkPolicies ≥ 95%% of Coordino without policy",
			cluster.Rules, cluster.ClusterPolicies), c, c >= 0.95})
	}
}

// WriteTable prints the report for humans (and for docs).
func (r *Report) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "policybench %s — %d CPUs, %s, kernel %s; %d round(s), iperf3 %ds, connections %v × %d workers; took %s\n\n",
		r.Date, r.Machine.CPUs, r.Machine.Model, r.Machine.Kernel, r.Params.Rounds, r.Params.IperfSeconds,
		r.Params.ConnDuration, r.Params.ConnWorkers, r.Duration)
	fmt.Fprintf(w, "| configuration | rules/end | entries | throughput Gbit/s | vs baseline | conn/s | vs baseline | conn errors |\n")
	fmt.Fprintf(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, x := range r.Rows {
		rules := "–"
		if x.Rules > 0 {
			rules = fmt.Sprint(x.Rules)
		}
		fmt.Fprintf(w, "| %s | %s | %d | %.2f | %.3f | %.0f | %.3f | %d |\n",
			x.Label, rules, x.PolicyEntries, x.MedianGbps, x.GbpsRatio, x.MedianConn, x.ConnRatio, x.ConnErrors)
	}
	if len(r.Targets) > 0 {
		fmt.Fprintln(w)
		for _, t := range r.Targets {
			verdict := "NOT met"
			if t.Met {
				verdict = "met"
			}
			fmt.Fprintf(w, "- %s: %.3f — %s\n", t.Name, t.Value, verdict)
		}
	}
}
