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
