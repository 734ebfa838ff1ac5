package main

import (
	"context"
	"testing"
	"time"

	"github.com/coordino/coordino/test/privileged"
)

// TestQuickRunFillsEveryRow keeps the benchmark from rotting: a -quick-sized
// run must produce latencies for every row. It asserts nothing about speed.
func TestQuickRunFillsEveryRow(t *testing.T) {
	privileged.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := QuickParams()
	p.N, p.Rounds, p.Warmup = 8, 1, 1
	r, err := Run(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Errors) > 0 {
		t.Errorf("systems failed: %v", r.Errors)
	}
	if want := 2 * 2 * 4; len(r.Rows) != want {
		t.Errorf("got %d rows, want %d", len(r.Rows), want)
	}
	for _, rows := range [][]Row{r.Rows, r.Daemon} {
		for _, x := range rows {
			if x.N == 0 || x.Errors > 0 || x.P50 <= 0 || x.P99 < x.P50 {
				t.Errorf("row %s %s %s: %+v", x.Mode, x.Verb, x.System, x.Stats)
			}
		}
	}
	if a := r.Process.Alone; a == nil || a.PluginAddFaults <= 0 || a.EmptyFaults <= 0 {
		t.Errorf("plugin process alone: no page faults measured: %+v", a)
	}
	for _, tg := range r.Targets {
		if tg.Met == nil {
			t.Errorf("target %q not measured", tg.Name)
		}
	}
}
