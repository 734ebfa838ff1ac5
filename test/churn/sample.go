package main

import (
	"context"
	"time"

	"github.com/coordino/coordino/test/harness"
)

// sample reads the daemon's CPU and RSS every p.SampleEvery until the
// returned function is called.
func (c *churn) sample(ctx context.Context, out *[]Sample) (stop func()) {
	pid := c.node.DaemonPID()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		start := time.Now()
		lastCPU, lastAt := harness.ProcCPU(pid), start
		tick := time.NewTicker(c.p.SampleEvery)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case now := <-tick.C:
				cpu := harness.ProcCPU(pid)
				*out = append(*out, Sample{
					At:     now.Sub(start).Seconds(),
					CPUPct: 100 * float64(cpu-lastCPU) / float64(now.Sub(lastAt)),
					RSSMB:  harness.ProcRSS(pid),
					Live:   int(c.live.Load()),
				})
				lastCPU, lastAt = cpu, now
			}
		}
	}()
	return func() { close(done); <-finished }
}

// steadyState are the samples after the population has ramped up and
// before pods stop being started: the slopes are read over those.
func steadyState(s []Sample, rampUp, end time.Duration) []Sample {
	var out []Sample
	for _, x := range s {
		if t := time.Duration(x.At * float64(time.Second)); t >= rampUp && t <= end {
			out = append(out, x)
		}
	}
	return out
}

// slope is the least-squares slope of pick over the samples, per minute.
func slope(s []Sample, pick func(Sample) float64) float64 {
	if len(s) < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for _, x := range s {
		t, y := x.At/60, pick(x)
		sx, sy, sxx, sxy = sx+t, sy+y, sxx+t*t, sxy+t*y
	}
	n := float64(len(s))
	den := n*sxx - sx*sx
	if den == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / den
}

// Minute is one minute of the run.
type Minute struct {
	Minute int `json:"minute"`
	// Adds are the ADDs started in this minute; their latency percentiles in ms.
	Adds   int     `json:"adds"`
	AddP50 float64 `json:"add_p50_ms"`
	AddP99 float64 `json:"add_p99_ms"`
	// CPUPct is the daemon's mean CPU (% of one core) over the samples in
	// this minute; RSSMB its RSS at the last of them.
	CPUPct float64 `json:"cpu_pct"`
	RSSMB  float64 `json:"rss_mb"`
}

// perMinute buckets samples and ADDs (started at addAt, taking adds) by
// minute of the run.
func perMinute(samples []Sample, addAt, adds []time.Duration) []Minute {
	var out []Minute
	at := func(m int) *Minute {
		for len(out) <= m {
			out = append(out, Minute{Minute: len(out) + 1})
		}
		return &out[m]
	}
	took := map[int][]time.Duration{}
	for i, a := range addAt {
		m := int(a / time.Minute)
		took[m] = append(took[m], adds[i])
		at(m).Adds++
	}
	for m, d := range took {
		st := harness.Summarize(d, 0)
		at(m).AddP50, at(m).AddP99 = st.P50, st.P99
	}
	cpu := map[int][]float64{}
	for _, s := range samples {
		m := int(s.At / 60)
		cpu[m] = append(cpu[m], s.CPUPct)
		at(m).RSSMB = s.RSSMB
	}
	for m, v := range cpu {
		sum := 0.0
		for _, x := range v {
			sum += x
		}
		at(m).CPUPct = sum / float64(len(v))
	}
	return out
}

// mean of pick over the samples.
func mean(s []Sample, pick func(Sample) float64) float64 {
	if len(s) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range s {
		sum += pick(x)
	}
	return sum / float64(len(s))
}
