package main

import (
	"syscall"
	"time"

	"github.com/coordino/coordino/test/harness"
)

// CPU is the processor time one operation cost on average, in
// milliseconds, split by who spent it. On a small shared machine CPU per
// operation, not wall time, bounds what concurrency can buy.
type CPU struct {
	// Plugins is the plugin processes (and the IPAM plugins they exec).
	Plugins float64 `json:"plugins_ms"`
	// Daemon is coordino-daemon, for systems that have one.
	Daemon float64 `json:"daemon_ms"`
	// Driver is this process: libcni, its result cache, namespace switches.
	Driver float64 `json:"driver_ms"`
}

// cpuSnap is a reading of the three CPU counters.
type cpuSnap struct{ children, self, daemon time.Duration }

// readCPU reads the counters. It is only meaningful around a phase that
// runs one system alone: every exited child then belongs to it.
func readCPU(daemonPID int) cpuSnap {
	var s cpuSnap
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru) == nil {
		s.children = rusageTime(ru)
	}
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = rusageTime(ru)
	}
	if daemonPID > 0 {
		s.daemon = harness.ProcCPU(daemonPID)
	}
	return s
}

func rusageTime(ru syscall.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (a cpuSnap) sub(b cpuSnap) cpuSnap {
	return cpuSnap{a.children - b.children, a.self - b.self, a.daemon - b.daemon}
}

func (a cpuSnap) add(b cpuSnap) cpuSnap {
	return cpuSnap{a.children + b.children, a.self + b.self, a.daemon + b.daemon}
}

func (a cpuSnap) perOp(ops int) *CPU {
	if ops == 0 {
		return nil
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(ops) }
	return &CPU{Plugins: ms(a.children), Daemon: ms(a.daemon), Driver: ms(a.self)}
}
