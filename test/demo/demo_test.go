package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// TestDemo runs the whole tour so `make demo` cannot rot unnoticed.
func TestDemo(t *testing.T) {
	privileged.Require(t)
	if err := harness.RequireBinaries(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), privileged.Slowdown(2*time.Minute))
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, options{out: &out})
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatalf("demo failed: %v", err)
	}
	got := out.String()
	if strings.Contains(got, "\x1b[") {
		t.Error("colour codes in non-terminal output")
	}
	for _, want := range []string{
		"── 1/9  Start a node",
		"✓ daemon pid",
		"web  ", "api  ", "db   ",
		"✓ 18/18 TCP connections answered by the right pod",
		"✓ CHECK web now fails and names the missing route",
		"prevResult passed through untouched",
		"✓ DEL db returned in",
		"✓ queued DEL applied at start-up",
		"with CNI error 11 (try again later)",
		"✓ the runtime retries: ADD late succeeds now",
		"reclaimed job-1 and job-2",
		"✓ metrics agree with the node",
		"✓ nothing left: 0 veths, 0 pins, 0 addresses, 0 endpoints, 0 host-local leases, 0 queued DELs",
		"✓ removed: daemon stopped",
		"checks passed in",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(got, "✗") {
		t.Error("output reports a failed check")
	}
}

// TestDemoCleansUpWhenInterrupted cancels the tour part-way, as Ctrl-C does,
// and expects an error but no leftovers (run verifies those itself).
func TestDemoCleansUpWhenInterrupted(t *testing.T) {
	privileged.Require(t)
	if err := harness.RequireBinaries(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out bytes.Buffer
	w := &cancelAfter{w: &out, marker: "── 3/9", cancel: cancel}
	err := run(ctx, options{out: w})
	t.Logf("demo output:\n%s", out.String())
	if err == nil {
		t.Fatal("interrupted demo reported success")
	}
	if !strings.Contains(out.String(), "cleaned up: no namespaces, mounts, processes or files left") {
		t.Fatal("interrupted demo did not confirm its cleanup")
	}
}

// cancelAfter cancels once marker has been written.
type cancelAfter struct {
	w      *bytes.Buffer
	marker string
	cancel context.CancelFunc
}

func (c *cancelAfter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	if strings.Contains(c.w.String(), c.marker) {
		c.cancel()
	}
	return n, err
}
