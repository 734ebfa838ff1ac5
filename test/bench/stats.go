package main

import (
	"math"
	"sort"
	"sync"
	"time"
)

// Stats summarise one row's latencies, in milliseconds.
type Stats struct {
	N      int     `json:"n"`
	Errors int     `json:"errors"`
	P50    float64 `json:"p50_ms"`
	P90    float64 `json:"p90_ms"`
	P99    float64 `json:"p99_ms"`
	Mean   float64 `json:"mean_ms"`
}

// summarize computes nearest-rank percentiles: with few samples a p99 is
// then an observed latency, never an interpolation.
func summarize(d []time.Duration, errs int) Stats {
	st := Stats{N: len(d), Errors: errs}
	if len(d) == 0 {
		return st
	}
	ms := make([]float64, len(d))
	sum := 0.0
	for i, v := range d {
		ms[i] = float64(v) / float64(time.Millisecond)
		sum += ms[i]
	}
	sort.Float64s(ms)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p/100*float64(len(ms)))) - 1
		return ms[max(0, min(i, len(ms)-1))]
	}
	st.P50, st.P90, st.P99, st.Mean = rank(50), rank(90), rank(99), sum/float64(len(ms))
	return st
}

type rowKey struct{ mode, verb, system string }

// samples collects latencies from concurrent workers.
type samples struct {
	mu   sync.Mutex
	d    map[rowKey][]time.Duration
	errs map[rowKey]int
	cpu  map[rowKey]cpuSnap
	ops  map[rowKey]int // operations the cpu readings cover
}

func newSamples() *samples {
	return &samples{d: map[rowKey][]time.Duration{}, errs: map[rowKey]int{}, cpu: map[rowKey]cpuSnap{}, ops: map[rowKey]int{}}
}

func (s *samples) add(mode, verb, system string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := rowKey{mode, verb, system}
	s.d[k] = append(s.d[k], d)
}

func (s *samples) fail(mode, verb, system string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs[rowKey{mode, verb, system}]++
}

func (s *samples) stats(mode, verb, system string) Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := rowKey{mode, verb, system}
	return summarize(s.d[k], s.errs[k])
}

func (s *samples) addCPU(mode, verb, system string, used cpuSnap, ops int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := rowKey{mode, verb, system}
	s.cpu[k] = s.cpu[k].add(used)
	s.ops[k] += ops
}

func (s *samples) cpuPerOp(mode, verb, system string) *CPU {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := rowKey{mode, verb, system}
	return s.cpu[k].perOp(s.ops[k])
}
