package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	quick := flag.Bool("quick", false, "seconds-long run: sizes 10,100, one round, 1 s iperf3 (explicit flags still win)")
	scale := flag.Bool("scale", false, "measure ADD latency with 0, 1k, 10k NetworkPolicies loaded and policy change to enforcement time (-sizes: policy counts)")
	sp := DefaultScaleParams()
	flag.IntVar(&sp.Pods, "pods", sp.Pods, "-scale: measured ADDs per size and mode")
	flag.IntVar(&sp.Concurrency, "concurrency", sp.Concurrency, "-scale: ADDs in flight in the concurrent mode")
	flag.IntVar(&sp.Changes, "changes", sp.Changes, "-scale: policy changes timed at the largest size")
	datapaths := flag.String("datapaths", strings.Join(sp.Datapaths, ","), "-scale: comma-separated --datapath values, one node each; the first is the reference")
	flag.IntVar(&sp.ClusterPolicies, "cluster-policies", sp.ClusterPolicies, "-scale: ClusterNetworkPolicies added to the largest size in one more configuration (0: none)")
	asJSON := flag.Bool("json", false, "print the report as JSON instead of a table")
	sizes := flag.String("sizes", "", "comma-separated rules per end (default 10,1000,10000)")
	p := DefaultParams()
	flag.IntVar(&p.Rounds, "rounds", p.Rounds, "rounds; each measures every configuration once")
	flag.IntVar(&p.IperfSeconds, "iperf-seconds", p.IperfSeconds, "length of one iperf3 run (whole seconds)")
	flag.DurationVar(&p.ConnDuration, "conn-duration", p.ConnDuration, "length of one connection-rate run")
	flag.IntVar(&p.ConnWorkers, "conn-workers", p.ConnWorkers, "parallel dialers")
	flag.BoolVar(&p.NftSets, "nft-sets", p.NftSets, "also measure nftables with a set lookup")
	flag.StringVar(&p.Datapath, "datapath", p.Datapath, "the Coordino node's --datapath (ebpf, nftables)")
	flag.Parse()
	if *scale {
		sp.Datapaths = strings.Split(*datapaths, ",")
		runScale(sp, *quick, *sizes, *asJSON, p.Rounds)
		return
	}
	if *quick {
		q := QuickParams()
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["rounds"] {
			p.Rounds = q.Rounds
		}
		if !set["iperf-seconds"] {
			p.IperfSeconds = q.IperfSeconds
		}
		if !set["conn-duration"] {
			p.ConnDuration = q.ConnDuration
		}
		p.Sizes = q.Sizes
	}
	if *sizes != "" {
		p.Sizes = parseSizes(*sizes, 2)
	}
	p.Progress = os.Stderr
	runReport(*asJSON, func(ctx context.Context) (*Report, error) { return Run(ctx, p) })
}

// parseSizes parses the -sizes list; entries below least exit with usage.
func parseSizes(list string, least int) []int {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < least {
			fmt.Fprintf(os.Stderr, "policybench: bad -sizes entry %q (want integers ≥ %d)\n", s, least)
			os.Exit(2)
		}
		out = append(out, n)
	}
	return out
}

// runReport runs one measurement; SIGINT/SIGTERM cancel it (the
// measurement in flight stops and every netns, daemon, pod and nft table
// goes), then prints the report as a table or JSON.
func runReport[R interface{ WriteTable(io.Writer) }](asJSON bool, run func(context.Context) (R, error)) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := run(ctx)
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "policybench: interrupted; cleaned up")
		os.Exit(130)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "policybench:", err)
		os.Exit(1)
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
		return
	}
	r.WriteTable(os.Stdout)
}

// runScale is main for -scale.
func runScale(p ScaleParams, quick bool, sizes string, asJSON bool, rounds int) {
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if quick {
		q := QuickScaleParams()
		p.Sizes = q.Sizes
		if !set["pods"] {
			p.Pods = q.Pods
		}
		if !set["concurrency"] {
			p.Concurrency = q.Concurrency
		}
		if !set["changes"] {
			p.Changes = q.Changes
		}
		if !set["cluster-policies"] {
			p.ClusterPolicies = q.ClusterPolicies
		}
		p.Rounds = q.Rounds
		if !set["datapaths"] {
			p.Datapaths = q.Datapaths
		}
	}
	if set["rounds"] {
		p.Rounds = rounds
	}
	if sizes != "" {
		p.Sizes = parseSizes(sizes, 0)
	}
	p.Progress = os.Stderr
	runReport(asJSON, func(ctx context.Context) (*ScaleReport, error) { return RunScale(ctx, p) })
}
