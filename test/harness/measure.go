package harness

import (
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Stats summarise latencies, in milliseconds.
type Stats struct {
	N      int     `json:"n"`
	Errors int     `json:"errors"`
	P50    float64 `json:"p50_ms"`
	P90    float64 `json:"p90_ms"`
	P99    float64 `json:"p99_ms"`
	Mean   float64 `json:"mean_ms"`
}

// Summarize computes nearest-rank percentiles: with few samples a p99 is
// then an observed latency, never an interpolation.
func Summarize(d []time.Duration, errs int) Stats {
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

// ProcCPU is utime+stime of a live process from /proc/<pid>/stat, or 0.
func ProcCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the parenthesised command name; utime and stime are the
	// 14th and 15th fields of the line, in clock ticks (USER_HZ, 100).
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(fields[11], 10, 64)
	st, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(u+st) * (time.Second / 100)
}

// ProcRSS is a live process's resident set (VmRSS) in MiB, or 0.
func ProcRSS(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}
