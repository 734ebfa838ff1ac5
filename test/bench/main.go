package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	p := DefaultParams()
	quick := flag.Bool("quick", false, "short run: n=16, concurrency 4, 2 rounds, 2 warm-ups (explicit flags still win)")
	asJSON := flag.Bool("json", false, "print the report as JSON instead of a table")
	flag.IntVar(&p.N, "n", p.N, "measured pods per system and mode")
	flag.IntVar(&p.Concurrency, "concurrency", p.Concurrency, "workers in the concurrent mode")
	flag.IntVar(&p.Rounds, "rounds", p.Rounds, "rounds per mode; system order rotates each round")
	flag.IntVar(&p.Warmup, "warmup", p.Warmup, "unmeasured ADD+DEL pairs per system first")
	flag.Parse()
	if *quick {
		q := QuickParams()
		// Flags given explicitly override the quick preset.
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, dst := range map[string]*int{"n": &p.N, "concurrency": &p.Concurrency, "rounds": &p.Rounds, "warmup": &p.Warmup} {
			if !set[name] {
				*dst = map[string]int{"n": q.N, "concurrency": q.Concurrency, "rounds": q.Rounds, "warmup": q.Warmup}[name]
			}
		}
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
		return
	}
	r.WriteTable(os.Stdout)
}
