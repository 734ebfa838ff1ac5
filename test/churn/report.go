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
	fmt.Fprintf(w, "\ndaemon over time (CPU %% of one core over each period, RSS MiB, live pods):\n")
	for _, s := range r.Samples {
		fmt.Fprintf(w, "  t=%6.0fs  cpu %6.1f%%  rss %7.1f  live %4d\n", s.At, s.CPUPct, s.RSSMB, s.Live)
	}
	fmt.Fprintf(w, "slopes: CPU %+.2f %%/min, RSS %+.2f MiB/min\n", r.CPUSlope, r.RSSSlope)
	fmt.Fprintf(w, "\nerrors: %d\n", r.Errors)
	for _, f := range r.Failures {
		fmt.Fprintf(w, "  %s\n", f)
	}
	if len(r.Leaks) == 0 {
		fmt.Fprintln(w, "leaks: none (veths, pins, addresses, records, queued DELs, BPF endpoint/ipcache/policy/conntrack entries as before the first pod)")
	} else {
		fmt.Fprintln(w, "leaks:")
		for _, l := range r.Leaks {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
	verdict := map[bool]string{true: "met", false: "MISSED"}
	fmt.Fprintf(w, "\ngoals: zero errors, ADD p99 < 250 ms (%.1f ms), nothing leaked: %s\n", r.Add.P99, verdict[r.OK()])
}
