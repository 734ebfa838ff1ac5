package main

import (
	"sync"
	"time"

	"github.com/coordino/coordino/test/harness"
)

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

func (s *samples) stats(mode, verb, system string) harness.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := rowKey{mode, verb, system}
	return harness.Summarize(s.d[k], s.errs[k])
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
