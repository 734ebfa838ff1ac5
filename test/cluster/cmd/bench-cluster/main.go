//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	log.SetFlags(log.Ltime)
	p := params{
		PodsPerNode:   envInt("BENCH_CLUSTER_PODS", 110),
		CreateRate:    envFloat("BENCH_CLUSTER_CREATE_RATE", 10),
		ChurnPerNode:  envInt("BENCH_CLUSTER_CHURN_RATE", 500),
		ChurnDuration: envDuration("BENCH_CLUSTER_CHURN_DURATION", 3*time.Minute),
		Workers:       3,
	}
	short := flag.Bool("short", false, "quick run: 10 pods per node, 30 s of churn at 60 pods/node/min (environment overrides)")
	cnis := flag.String("cni", "coordino,reference", "CNIs to measure, in order (coordino, reference)")
	flag.Parse()
	if *short {
		p.PodsPerNode = envInt("BENCH_CLUSTER_PODS", 10)
		p.ChurnPerNode = envInt("BENCH_CLUSTER_CHURN_RATE", 60)
		p.ChurnDuration = envDuration("BENCH_CLUSTER_CHURN_DURATION", 30*time.Second)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var results []result
	failed := false
	for _, cni := range strings.Split(*cnis, ",") {
		if cni != "coordino" && cni != "reference" {
			log.Fatalf("unknown CNI %q (coordino, reference)", cni)
		}
		r, err := run(ctx, cni, p, log.Printf)
		if err != nil {
			log.Printf("bench %s: %v", cni, err)
			failed = true
			break
		}
		results = append(results, r)
	}
	if !report(os.Stdout, p, results) || failed {
		os.Exit(1)
	}
}

// report prints the results side by side and whether every run met the
// goals (every pod Running, no Warning event, nothing leaked).
func report(w io.Writer, p params, rs []result) bool {
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(w, "\nPod startup at density, %s, %d workers; %d pods/node created at %.1f pods/s, then churn %d pods/node/min for %s (loadavg %s)\n",
		time.Now().UTC().Format("2006-01-02 15:04"), p.Workers, p.PodsPerNode, p.CreateRate, p.ChurnPerNode, p.ChurnDuration, strings.TrimSpace(string(load)))
	row := func(label string, f func(r result) string) {
		fmt.Fprintf(w, "  %-40s", label)
		for _, r := range rs {
			fmt.Fprintf(w, " %14s", f(r))
		}
		fmt.Fprintln(w)
	}
	ms := func(v float64) string { return fmt.Sprintf("%.0f ms", v) }
	sec := func(v float64) string {
		if math.IsNaN(v) {
			return "n/a"
		}
		return fmt.Sprintf("%.0f ms", v*1000)
	}
	row("", func(r result) string { return r.CNI })
	row("bed up", func(r result) string { return r.Up.Round(time.Second).String() })
	row("create: created→Running p50", func(r result) string { return ms(r.Create.P50) })
	row("create: created→Running p99", func(r result) string { return ms(r.Create.P99) })
	row("churn: created→Running p50", func(r result) string { return ms(r.Churn.P50) })
	row("churn: created→Running p99", func(r result) string { return ms(r.Churn.P99) })
	row("churn achieved (pods/node/min)", func(r result) string { return fmt.Sprintf("%.0f", r.ChurnAchieved) })
	row("kubelet sandbox creation p50", func(r result) string { return sec(r.SandboxP50) })
	row("kubelet sandbox creation p99", func(r result) string { return sec(r.SandboxP99) })
	row("CNI ADD p50 (daemon metrics)", func(r result) string { return sec(r.AddP50) })
	row("CNI ADD p99 (daemon metrics)", func(r result) string { return sec(r.AddP99) })
	row("CNI ADDs / CNI errors (daemon metrics)", func(r result) string {
		if r.CNI != "coordino" {
			return "n/a"
		}
		n := 0.0
		for _, v := range r.CNIErrors {
			n += v
		}
		return fmt.Sprintf("%.0f / %.0f", r.Adds, n)
	})
	row("ADDs refused: pod not in daemon cache", func(r result) string {
		if r.CNI != "coordino" {
			return "n/a"
		}
		return fmt.Sprintf("%.0f", r.LabelMisses)
	})
	row("churned pods deleted before Running", func(r result) string { return strconv.Itoa(r.DeletedBeforeRunning) })
	row("pods never Running while alive", func(r result) string { return strconv.Itoa(r.NotRunning) })
	row("Warnings, pods deleted while starting", func(r result) string { return strconv.Itoa(r.DeletedWarnings) })
	row("Warning events, other", func(r result) string {
		n := 0
		for _, c := range r.Warnings {
			n += c
		}
		return strconv.Itoa(n)
	})
	row("nodes with leftovers after delete", func(r result) string { return strconv.Itoa(len(r.Leaks)) })
	row("delete all → nodes at baseline", func(r result) string { return r.DeleteWait.Round(time.Second).String() })
	if len(rs) == 2 && rs[1].Create.P50 > 0 && rs[1].Churn.P50 > 0 {
		c, ref := rs[0], rs[1]
		fmt.Fprintf(w, "  ratio %s/%s created→Running: create p50 %.2f p99 %.2f, churn p50 %.2f p99 %.2f; sandbox p50 %.2f p99 %.2f\n",
			c.CNI, ref.CNI, c.Create.P50/ref.Create.P50, c.Create.P99/ref.Create.P99,
			c.Churn.P50/ref.Churn.P50, c.Churn.P99/ref.Churn.P99, c.SandboxP50/ref.SandboxP50, c.SandboxP99/ref.SandboxP99)
	}
	ok := true
	for _, r := range rs {
		for _, reason := range sortedKeys(r.Warnings) {
			fmt.Fprintf(w, "  %s: %d Warning events %s\n", r.CNI, r.Warnings[reason], reason)
			ok = false
		}
		for _, s := range r.WarningSamples {
			fmt.Fprintf(w, "    e.g. %s\n", s)
		}
		for _, k := range sortedKeys(r.CNIErrors) {
			fmt.Fprintf(w, "  %s: %.0f CNI errors %s\n", r.CNI, r.CNIErrors[k], k)
			ok = false
		}
		for _, n := range sortedKeys(r.Leaks) {
			fmt.Fprintf(w, "  %s: %s not back to its state before the run:\n    %s\n", r.CNI, n, strings.Join(r.Leaks[n], "\n    "))
			ok = false
		}
		if r.NotRunning > 0 {
			ok = false
		}
	}
	verdict := "met"
	if !ok {
		verdict = "MISSED"
	}
	fmt.Fprintf(w, "goals (every live pod Running, no Warning event but on pods deleted while starting, no CNI error, nothing left on a node): %s\n", verdict)
	return ok
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return v
	}
	return def
}

func envFloat(k string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(k), 64); err == nil {
		return v
	}
	return def
}

func envDuration(k string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(k)); err == nil {
		return v
	}
	return def
}
