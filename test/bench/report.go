package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/harness"
)

// Report is the outcome of one run; -json prints it as is.
type Report struct {
	Date     string  `json:"date"`
	Machine  Machine `json:"machine"`
	Params   Params  `json:"params"`
	Duration string  `json:"duration"`
	// Rows are client-side latencies: the libcni call as a runtime sees it.
	Rows []Row `json:"rows"`
	// Daemon rows are coordino-daemon's own time per request (its "took"
	// log field), the part of a Coordino row spent inside the daemon.
	Daemon  []Row    `json:"daemon"`
	Targets []Target `json:"targets"`
	// Process compares one Coordino plugin exec with an empty Go binary's.
	Process *ProcessCost `json:"process,omitempty"`
	// Errors maps a system to its first failure; it was skipped after it.
	Errors map[string]string `json:"errors,omitempty"`
	// Binaries fingerprints what was measured: bin/ is shared, and a
	// rebuild during the run would mix two versions.
	Binaries map[string]string `json:"binaries"`
	Warnings []string          `json:"warnings,omitempty"`
}

// Machine describes where the numbers come from.
type Machine struct {
	CPUs      int    `json:"cpus"`
	Kernel    string `json:"kernel"`
	GoVersion string `json:"go"`
	// LoadAvg is /proc/loadavg at the end of the run: a shared VM's
	// background load belongs next to its numbers.
	LoadAvg string `json:"loadavg"`
}

// Row is one (mode, verb, system) latency summary.
type Row struct {
	Mode   string `json:"mode"`
	Verb   string `json:"verb"`
	System string `json:"system"`
	harness.Stats
	// CPU per operation, for client-side rows.
	CPU *CPU `json:"cpu_per_op,omitempty"`
}

// Target is one agreed goal, read against the measured value.
type Target struct {
	Name  string `json:"name"`
	Goal  string `json:"goal"`
	Value string `json:"value"`
	// Met is nil when there was nothing to measure it with.
	Met *bool `json:"met"`
}

func (b *bed) report(p Params, modes []mode, took time.Duration) *Report {
	r := &Report{
		Date:     time.Now().UTC().Format(time.RFC3339),
		Machine:  machine(),
		Params:   p,
		Duration: took.Round(time.Second).String(),
	}
	daemonTook := b.daemonTimes()
	for _, m := range modes {
		for _, verb := range []string{VerbAdd, VerbDel} {
			for _, s := range b.systems {
				r.Rows = append(r.Rows, Row{Mode: m.Name, Verb: verb, System: s.name,
					Stats: b.res.stats(m.Name, verb, s.name), CPU: b.res.cpuPerOp(m.Name, verb, s.name)})
				if s.daemon {
					r.Daemon = append(r.Daemon, Row{Mode: m.Name, Verb: verb, System: s.name, Stats: daemonTook.stats(m.Name, verb, s.name)})
				}
			}
		}
	}
	for _, s := range b.systems {
		if err := s.failed(); err != nil {
			if r.Errors == nil {
				r.Errors = map[string]string{}
			}
			r.Errors[s.name] = err.Error()
		}
	}
	r.Process = b.processCost(r, modes[0].Name)
	r.Targets = targets(r, modes)
	r.Binaries = b.binaries
	if now := b.fingerprint(); !maps.Equal(now, b.binaries) {
		r.Warnings = append(r.Warnings, fmt.Sprintf("binaries changed during the run: %v at start, %v at end", b.binaries, now))
	}
	return r
}

// fingerprint is a short SHA-256 of each binary the run executes.
func fingerprint() map[string]string {
	out := map[string]string{}
	for _, p := range []string{
		filepath.Join(harness.BinDir(), "coordino"), filepath.Join(harness.BinDir(), "coordino-daemon"),
		filepath.Join(harness.RefBinDir(), "bridge"), filepath.Join(harness.RefBinDir(), "host-local"),
	} {
		out[filepath.Base(p)] = fileSum(p)
	}
	return out
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.LoadAvg = strings.TrimSpace(string(la))
	}
	return m
}

// daemonTimes reads the "took" of every measured request from the daemon
// logs (the harness runs the daemon at debug level, which logs each one).
func (b *bed) daemonTimes() *samples {
	out := newSamples()
	for _, s := range b.systems {
		if !s.daemon {
			continue
		}
		sc := bufio.NewScanner(strings.NewReader(s.node.LogTail(1 << 30)))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var e struct {
				Msg, Verb, ContainerID string
				Took                   float64 // seconds: zap's production encoder
			}
			if json.Unmarshal(sc.Bytes(), &e) != nil || e.Msg != "CNI request done" {
				continue
			}
			if m, ok := b.modeOf[e.ContainerID]; ok && (e.Verb == VerbAdd || e.Verb == VerbDel) {
				out.add(m, e.Verb, s.name, time.Duration(e.Took*float64(time.Second)))
			}
		}
	}
	return out
}

func (r *Report) row(mode, verb, system string) harness.Stats {
	for _, x := range r.Rows {
		if x.Mode == mode && x.Verb == verb && x.System == system {
			return x.Stats
		}
	}
	return harness.Stats{}
}

// ProcessCost is the CPU of one plugin exec against the floor any Go plugin
// pays, both measured in the same run.
type ProcessCost struct {
	// EmptyExecCPU is one exec of an empty static Go binary, ms.
	EmptyExecCPU float64 `json:"empty_exec_cpu_ms"`
	// PluginAddCPU is the coordino plugin process per sequential ADD, ms.
	PluginAddCPU float64 `json:"plugin_add_cpu_ms"`
	PluginBytes  int64   `json:"plugin_bytes"`
	EmptyBytes   int64   `json:"empty_bytes"`
	// Alone is the plugin process alone against a stub daemon.
	Alone *ExecCost `json:"alone,omitempty"`
}

func (b *bed) processCost(r *Report, seq string) *ProcessCost {
	var add *CPU
	for _, x := range r.Rows {
		if x.Mode == seq && x.Verb == VerbAdd && x.System == SysCoordino {
			add = x.CPU
		}
	}
	if b.emptyN == 0 || add == nil {
		return nil
	}
	pc := &ProcessCost{EmptyExecCPU: float64(b.emptyCPU) / float64(time.Millisecond) / float64(b.emptyN), PluginAddCPU: add.Plugins, Alone: b.execCost}
	if fi, err := os.Stat(filepath.Join(harness.BinDir(), "coordino")); err == nil {
		pc.PluginBytes = fi.Size()
	}
	if fi, err := os.Stat(b.empty); err == nil {
		pc.EmptyBytes = fi.Size()
	}
	return pc
}

// ratioTarget is a goal on Coordino's value over the reference's.
func ratioTarget(name string, c, ref harness.Stats, pick func(harness.Stats) float64, limit float64) Target {
	t := Target{Name: name, Goal: fmt.Sprintf("<= %.1fx", limit), Value: "n/a"}
	if c.N > 0 && ref.N > 0 && pick(ref) > 0 {
		ratio := pick(c) / pick(ref)
		ok := ratio <= limit
		t.Value, t.Met = fmt.Sprintf("%.2fx", ratio), &ok
	}
	return t
}

func targets(r *Report, modes []mode) []Target {
	seq, conc := modes[0].Name, modes[1].Name
	met := func(ok bool) *bool { return &ok }
	p50 := func(s harness.Stats) float64 { return s.P50 }
	p99 := func(s harness.Stats) float64 { return s.P99 }
	out := []Target{
		ratioTarget("ADD p50, Coordino / reference ("+seq+")", r.row(seq, VerbAdd, SysCoordino), r.row(seq, VerbAdd, SysRef), p50, 0.5),
		ratioTarget("ADD p99, Coordino / reference ("+conc+")", r.row(conc, VerbAdd, SysCoordino), r.row(conc, VerbAdd, SysRef), p99, 0.5),
		ratioTarget("DEL p50, Coordino / reference ("+seq+")", r.row(seq, VerbDel, SysCoordino), r.row(seq, VerbDel, SysRef), p50, 1.0),
	}

	t := Target{Name: "chained ADD p50 cost, [bridge+host-local,coordino] - [bridge+host-local] (" + seq + ")", Goal: "<= +4 ms", Value: "n/a"}
	if c, ref := r.row(seq, VerbAdd, SysChained), r.row(seq, VerbAdd, SysRef); c.N > 0 && ref.N > 0 {
		d := c.P50 - ref.P50
		t.Value, t.Met = fmt.Sprintf("%+.1f ms", d), met(d <= 4)
	}
	out = append(out, t)

	t = Target{Name: "plugin CPU per ADD exec / empty Go binary exec (" + seq + ")", Goal: "<= 2.0x", Value: "n/a"}
	if pc := r.Process; pc != nil && pc.EmptyExecCPU > 0 {
		ratio := pc.PluginAddCPU / pc.EmptyExecCPU
		t.Value, t.Met = fmt.Sprintf("%.2fx", ratio), met(ratio <= 2)
	}
	out = append(out, t)

	t = Target{Name: "plugin CPU per ADD exec / empty Go binary exec (alone, stub daemon, medians)", Goal: "<= 2.0x", Value: "n/a"}
	if pc := r.Process; pc != nil && pc.Alone != nil && pc.Alone.EmptyCPU > 0 {
		ratio := pc.Alone.PluginAddCPU / pc.Alone.EmptyCPU
		t.Value, t.Met = fmt.Sprintf("%.2fx", ratio), met(ratio <= 2)
	}
	out = append(out, t)
	return out
}

// WriteTable prints the report for people.
func (r *Report) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "Coordino CNI latency benchmark, %s\n", r.Date)
	fmt.Fprintf(w, "machine: %d CPUs, kernel %s, %s, loadavg at end %q\n", r.Machine.CPUs, r.Machine.Kernel, r.Machine.GoVersion, r.Machine.LoadAvg)
	fmt.Fprintf(w, "run: %d pods per system and mode in %d rounds (system order rotated), %d warm-up ADD+DEL per system, concurrency %d, took %s\n",
		r.Params.N, r.Params.Rounds, r.Params.Warmup, r.Params.Concurrency, r.Duration)
	if len(r.Params.DaemonArgs) > 0 {
		fmt.Fprintf(w, "extra daemon flags: %s\n", strings.Join(r.Params.DaemonArgs, " "))
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "Client-side latency through libcni (ms):")
	writeRows(w, r.Rows, true)
	fmt.Fprintln(w, "\nInside coordino-daemon (its own request time, ms; the rest is plugin exec + gRPC + libcni):")
	writeRows(w, r.Daemon, false)

	fmt.Fprintln(w, "\nCPU time per operation (ms; plugin processes / coordino-daemon / this driver incl. libcni):")
	fmt.Fprintf(w, "  %-14s %-4s %-36s %8s %8s %8s %8s\n", "mode", "verb", "system", "plugins", "daemon", "driver", "total")
	for _, x := range r.Rows {
		if c := x.CPU; c != nil {
			fmt.Fprintf(w, "  %-14s %-4s %-36s %8.2f %8.2f %8.2f %8.2f\n", x.Mode, x.Verb, x.System, c.Plugins, c.Daemon, c.Driver, c.Plugins+c.Daemon+c.Driver)
		}
	}

	if pc := r.Process; pc != nil {
		fmt.Fprintf(w, "\nPlugin process: %.2f ms CPU per ADD exec (%.1f MB binary); empty static Go binary %.2f ms per exec (%.1f MB)\n",
			pc.PluginAddCPU, float64(pc.PluginBytes)/1e6, pc.EmptyExecCPU, float64(pc.EmptyBytes)/1e6)
		if a := pc.Alone; a != nil {
			fmt.Fprintf(w, "Plugin process alone (ADD against a stub daemon, %d alternating execs, medians): %.2f ms CPU, %.0f page faults; empty Go binary %.2f ms, %.0f page faults\n",
				a.N, a.PluginAddCPU, a.PluginAddFaults, a.EmptyCPU, a.EmptyFaults)
		}
	}

	r.writeBaseline(w)

	r.writeChainedFloor(w)

	fmt.Fprintln(w, "\nTargets:")
	for _, t := range r.Targets {
		verdict := "n/a"
		if t.Met != nil {
			verdict = map[bool]string{true: "met", false: "MISSED"}[*t.Met]
		}
		fmt.Fprintf(w, "  %-82s %-10s goal %-18s %s\n", t.Name, t.Value, t.Goal, verdict)
	}
	fmt.Fprintf(w, "\nBinaries (sha256): %v\n", r.Binaries)
	for _, warn := range r.Warnings {
		fmt.Fprintf(w, "WARNING: %s\n", warn)
	}
	if len(r.Errors) > 0 {
		fmt.Fprintln(w, "\nErrors (system skipped after its first failure):")
		for sys, e := range r.Errors {
			fmt.Fprintf(w, "  %s: %s\n", sys, e)
		}
	}
}

// writeRows prints rows grouped by (mode, verb); with ratios, each group
// ends with Coordino / reference for every column.
func writeRows(w io.Writer, rows []Row, ratios bool) {
	fmt.Fprintf(w, "  %-14s %-4s %-36s %5s %4s %8s %8s %8s %8s\n", "mode", "verb", "system", "n", "err", "p50", "p90", "p99", "mean")
	for i, x := range rows {
		fmt.Fprintf(w, "  %-14s %-4s %-36s %5d %4d %s %s %s %s\n", x.Mode, x.Verb, x.System, x.N, x.Errors,
			ms(x.N, x.P50), ms(x.N, x.P90), ms(x.N, x.P99), ms(x.N, x.Mean))
		last := i == len(rows)-1 || rows[i+1].Mode != x.Mode || rows[i+1].Verb != x.Verb
		if !ratios || !last {
			continue
		}
		var c, ref harness.Stats
		for _, y := range rows {
			if y.Mode == x.Mode && y.Verb == x.Verb {
				switch y.System {
				case SysCoordino:
					c = y.Stats
				case SysRef:
					ref = y.Stats
				}
			}
		}
		fmt.Fprintf(w, "  %-14s %-4s %-36s %5s %4s %s %s %s %s\n", "", "", "ratio coordino/reference", "", "",
			ratio(c, ref, c.P50, ref.P50), ratio(c, ref, c.P90, ref.P90), ratio(c, ref, c.P99, ref.P99), ratio(c, ref, c.Mean, ref.Mean))
	}
}

func ms(n int, v float64) string {
	if n == 0 {
		return fmt.Sprintf("%8s", "-")
	}
	return fmt.Sprintf("%8.2f", v)
}

func ratio(c, ref harness.Stats, a, b float64) string {
	if c.N == 0 || ref.N == 0 || b == 0 {
		return fmt.Sprintf("%8s", "-")
	}
	return fmt.Sprintf("%7.2fx", a/b)
}

// writeChainedFloor prints the chained cost next to that of chaining a Go
// plugin that does nothing (chainnoop): the part of the cost that is
// libcni's second fork/exec and a Go process, which no daemon change moves.
func (r *Report) writeChainedFloor(w io.Writer) {
	seq := r.Params.modes()[0].Name
	ref := r.row(seq, VerbAdd, SysRef)
	c, noop := r.row(seq, VerbAdd, SysChained), r.row(seq, VerbAdd, SysChainedNoop)
	if ref.N == 0 || c.N == 0 || noop.N == 0 {
		return
	}
	fmt.Fprintf(w, "\nChained cost against its floor (%s ADD p50 minus %s's, ms):\n", seq, SysRef)
	fmt.Fprintf(w, "  %-36s %+8.2f\n  %-36s %+8.2f  (a Go plugin passing prevResult on)\n",
		SysChained, c.P50-ref.P50, SysChainedNoop, noop.P50-ref.P50)
}
