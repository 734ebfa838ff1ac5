package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	p := DefaultParams()
	quick := flag.Bool("quick", false, "short run: n=16, concurrency 4, 2 rounds, 2 warm-ups (explicit flags still win)")
	asJSON := flag.Bool("json", false, "print the report as JSON on stdout (the table goes to stderr)")
	flag.IntVar(&p.N, "n", p.N, "measured pods per system and mode")
	flag.IntVar(&p.Concurrency, "concurrency", p.Concurrency, "workers in the concurrent mode")
	flag.IntVar(&p.Rounds, "rounds", p.Rounds, "rounds per mode; system order rotates each round")
	flag.IntVar(&p.Warmup, "warmup", p.Warmup, "unmeasured ADD+DEL pairs per system first")
	daemonArgs := flag.String("daemon-args", "", "extra coordino-daemon flags, space-separated (e.g. --legacy-tc)")
	flag.StringVar(&p.BaselineDaemon, "baseline-daemon", "", "another coordino-daemon binary (e.g. built from main) measured in the same rounds, primary and chained, for an A/B")
	flag.Parse()
	p.DaemonArgs = strings.Fields(*daemonArgs)
	if *quick {
		// The preset fills in only what was not given explicitly.
		q := QuickParams()
		explicit := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
		preset := func(name string, dst *int, v int) {
			if !explicit[name] {
				*dst = v
			}
		}
		preset("n", &p.N, q.N)
		preset("concurrency", &p.Concurrency, q.Concurrency)
		preset("rounds", &p.Rounds, q.Rounds)
		preset("warmup", &p.Warmup, q.Warmup)
	}
	p.Progress = os.Stderr

	// The first SIGINT/SIGTERM cancels: calls in flight finish, owed DELs
	// run and every netns, daemon and mount goes. A second one kills.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }()

	r, err := Run(ctx, p)
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "bench: interrupted; cleaned up")
		os.Exit(130)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
		r.WriteTable(os.Stderr)
		return
	}
	r.WriteTable(os.Stdout)
}
