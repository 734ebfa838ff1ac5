package main

import (
	"fmt"
	"io"

	"github.com/coordino/coordino/test/harness"
)

// WriteTable prints the report for people.
func (r *Report) WriteTable(w io.Writer) {
	p := r.Params
	fmt.Fprintf(w, "Coordino pod churn benchmark, %s (loadavg at end %q)\n", r.Date, r.LoadAvg)
	fmt.Fprintf(w, "run: %d pods/min for %s, mean lifetime %s, %.0f%% fresh label sets, policies loaded, flow log on; %d pods\n\n",
		p.Rate, p.Duration, p.Lifetime, 100*p.FreshLabels, r.Pods)
	fmt.Fprintf(w, "  %-4s %6s %8s %8s %8s %8s\n", "verb", "n", "p50", "p90", "p99", "mean")
	for _, x := range []struct {
		verb string
		s    harness.Stats
	}{{"ADD", r.Add}, {"DEL", r.Del}} {
		fmt.Fprintf(w, "  %-4s %6d %8.2f %8.2f %8.2f %8.2f\n", x.verb, x.s.N, x.s.P50, x.s.P90, x.s.P99, x.s.Mean)
	}
	fmt.Fprintf(w, "\nminute by minute (ADDs started in the minute and their latency in ms; daemon CPU %% of one core, mean of the samples; daemon RSS MiB at the minute's last sample):\n")
	fmt.Fprintf(w, "  %6s %6s %8s %8s %8s %8s\n", "minute", "ADDs", "p50", "p99", "cpu%", "rss")
	for _, m := range r.Minutes {
		fmt.Fprintf(w, "  %6d %6d %8.2f %8.2f %8.1f %8.1f\n", m.Minute, m.Adds, m.AddP50, m.AddP99, m.CPUPct, m.RSSMB)
	}
	fmt.Fprintf(w, "daemon: %.2f ms CPU per pod; steady state (after two lifetimes, until the last start, %.1f min): CPU %.1f%% mean, slope %+.2f %%/min; RSS %.1f MiB mean, slope %+.2f MiB/min\n",
		r.DaemonCPUPerPod, r.SteadyMinutes, r.CPUMean, r.CPUSlope, r.RSSMean, r.RSSSlope)
	fmt.Fprintf(w, "\nerrors: %d\n", r.Errors)
	for _, f := range r.Failures {
		fmt.Fprintf(w, "  %s\n", f)
	}
	if len(r.Leaks) == 0 {
		fmt.Fprintln(w, "leaks: none (veths, pins, addresses, records, queued DELs, BPF endpoint/ipcache/policy/conntrack/pending-purge entries as before the first pod)")
	} else {
		fmt.Fprintln(w, "leaks:")
		for _, l := range r.Leaks {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
	fmt.Fprintf(w, "conntrack entries naming deleted pods (server pod still up, pending purges done): %d\n", r.StaleConntrack)
	fmt.Fprintf(w, "conntrack table walks purging deleted pods: %d for %d DELs (DEL itself walks none)\n", r.PurgeWalks, r.Del.N)
	fmt.Fprintf(w, "\nGoals (issue 15; timing goals are only meaningful on an idle machine, loadavg above):\n")
	for _, g := range r.Goals() {
		fmt.Fprintf(w, "  %-44s %-30s goal %-44s %s\n", g.Name, g.Value, g.Goal, g.Verdict)
	}
	fmt.Fprintf(w, "verdict: %s\n", map[bool]string{true: "every goal judged is met", false: "a goal is MISSED (exit status 2)"}[r.OK()])
}

const (
	met    = "met"
	missed = "MISSED"
	// notJudged marks a goal the run was too short to judge.
	notJudged = "n/a"
)

// Goal is one of the goals with this run's figure.
type Goal struct {
	Name, Value, Goal, Verdict string
}

// minSteadyMinutes is the shortest steady state whose slopes are judged.
const minSteadyMinutes = 3

// Flatness bounds: the fitted change over the steady state, as a share of
// the mean. CPU gets more room: it follows the machine's other load.
const (
	maxCPUDrift = 0.25
	maxRSSDrift = 0.10
)

// Goals are the run's figures against the goals.
func (r *Report) Goals() []Goal {
	verdict := func(ok bool) string { return map[bool]string{true: met, false: missed}[ok] }
	leaks := "none"
	if len(r.Leaks) > 0 {
		leaks = fmt.Sprintf("%d kinds (listed above)", len(r.Leaks))
	}
	flat := func(name, unit string, slope, mean, maxDrift float64) Goal {
		g := Goal{Name: name, Value: fmt.Sprintf("%+.2f %s/min (mean %.1f)", slope, unit, mean),
			Goal: fmt.Sprintf("flat: |slope x %.1f min| <= %.0f%% of mean", r.SteadyMinutes, 100*maxDrift)}
		switch {
		case r.SteadyMinutes < minSteadyMinutes:
			g.Verdict = fmt.Sprintf("%s (steady state under %d min)", notJudged, minSteadyMinutes)
		default:
			drift := slope * r.SteadyMinutes
			if drift < 0 {
				drift = -drift
			}
			g.Verdict = verdict(drift <= maxDrift*mean)
		}
		return g
	}
	return []Goal{
		{"errors (ADD, DEL, connections)", fmt.Sprint(r.Errors), "0", verdict(r.Errors == 0)},
		{"ADD p99", fmt.Sprintf("%.1f ms (p50 %.1f)", r.Add.P99, r.Add.P50), "< 250 ms", verdict(r.Add.N > 0 && r.Add.P99 < 250)},
		flat("daemon CPU over time", "%", r.CPUSlope, r.CPUMean, maxCPUDrift),
		flat("daemon RSS over time", "MiB", r.RSSSlope, r.RSSMean, maxRSSDrift),
		{"leaks after the run", leaks, "none", verdict(len(r.Leaks) == 0)},
		{"conntrack entries naming deleted pods", fmt.Sprint(r.StaleConntrack), "0", verdict(r.StaleConntrack == 0)},
	}
}
