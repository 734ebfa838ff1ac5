package main

import (
	"context"
	"testing"
	"time"

	"github.com/coordino/coordino/test/privileged"
)

// TestChurnSmoke keeps the churn benchmark from rotting: a few seconds of
// churn must run pods, take samples, report no errors and leave nothing
// behind. It asserts nothing about speed.
func TestChurnSmoke(t *testing.T) {
	privileged.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := DefaultParams()
	p.Duration, p.Lifetime, p.SampleEvery = 6*time.Second, 1500*time.Millisecond, time.Second
	r, err := Run(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if r.Pods < 20 || r.Add.N != r.Pods+1 || r.Del.N != r.Pods+1 {
		t.Errorf("pods %d, ADD samples %d, DEL samples %d (the server pod counts once more)", r.Pods, r.Add.N, r.Del.N)
	}
	if r.Errors != 0 {
		t.Errorf("%d errors: %v", r.Errors, r.Failures)
	}
	if len(r.Leaks) != 0 {
		t.Errorf("leaks: %v", r.Leaks)
	}
	if r.StaleConntrack != 0 {
		t.Errorf("%d conntrack entries still name deleted pods", r.StaleConntrack)
	}
	if len(r.Samples) < 3 {
		t.Errorf("only %d samples", len(r.Samples))
	}
	if len(r.Minutes) == 0 || r.Minutes[0].Adds == 0 {
		t.Errorf("no per-minute rows: %+v", r.Minutes)
	}
	if len(r.Goals()) == 0 {
		t.Error("no goals reported")
	}
}
