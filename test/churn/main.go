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
	"syscall"
)

func main() {
	p := DefaultParams()
	flag.DurationVar(&p.Duration, "duration", p.Duration, "how long pods are started (then every started pod is deleted)")
	flag.IntVar(&p.Rate, "rate", p.Rate, "pods started per minute")
	flag.DurationVar(&p.Lifetime, "lifetime", p.Lifetime, "mean time from a pod's ADD to its DEL")
	flag.Float64Var(&p.FreshLabels, "fresh-labels", p.FreshLabels, "share of pods with a never-seen label set")
	flag.DurationVar(&p.SampleEvery, "sample-every", p.SampleEvery, "daemon CPU/RSS sampling period")
	asJSON := flag.Bool("json", false, "print the report as JSON on stdout (the table goes to stderr)")
	flag.Parse()
	p.Progress = os.Stderr

	// The first SIGINT/SIGTERM stops starting pods; started ones are deleted and everything is removed.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }()

	r, err := Run(ctx, p)
	if errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "churn: interrupted; cleaned up")
		os.Exit(130)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "churn:", err)
		os.Exit(1)
	}
	var table io.Writer = os.Stdout
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
		table = os.Stderr
	}
	r.WriteTable(table)
	if !r.OK() {
		os.Exit(2)
	}
}
