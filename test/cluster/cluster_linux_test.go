//go:build linux

package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recordHolder writes a holder pid file for pid with the given start time.
func recordHolder(t *testing.T, dir string, pid int, start string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "pids"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("%d %s /proc/self/exe\n", pid, start)
	if err := os.WriteFile(filepath.Join(dir, "pids", "worker-1-holder.pid"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBedInTheWayNamesTheRunningBed: Up refusing the address plan because
// make cluster-up's bed holds it must say so, and say what to do; a bed
// whose holder is gone (a killed run) is not "up".
func TestBedInTheWayNamesTheRunningBed(t *testing.T) {
	cidrErr := errors.New("CIDR 10.233.0.0/24 overlaps host route 10.233.0.0/24 dev cbh-abc")
	up, dead, none := t.TempDir(), t.TempDir(), t.TempDir()
	// This test process stands in for a live holder; its start time is
	// field 22 of /proc/self/stat.
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	recordHolder(t, up, os.Getpid(), f[19])
	recordHolder(t, dead, os.Getpid(), "1") // same PID, another process's start time

	if !Running(up) || Running(dead) || Running(none) {
		t.Fatalf("Running: live %v, dead %v, empty %v; want true, false, false", Running(up), Running(dead), Running(none))
	}
	got := bedInTheWay(cidrErr, none, up).Error()
	for _, want := range []string{cidrErr.Error(), "cluster bed in " + up + " is up", "make cluster-down", "test/cluster/e2e.sh"} {
		if !strings.Contains(got, want) {
			t.Errorf("refusal %q does not say %q", got, want)
		}
	}
	if got := bedInTheWay(cidrErr, dead, none); !errors.Is(got, cidrErr) || got.Error() != cidrErr.Error() {
		t.Errorf("with no bed up: %v, want the route error alone", got)
	}
}
