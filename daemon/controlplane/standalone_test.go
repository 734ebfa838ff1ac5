package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/coordino/coordino/daemon/policy"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zaptest"
)

type recordingSink struct {
	mu    sync.Mutex
	snaps []policy.Snapshot
}

func (r *recordingSink) UpdatePolicy(s policy.Snapshot) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snaps = append(r.snaps, s)
	return nil
}

func (r *recordingSink) last() (policy.Snapshot, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.snaps) == 0 {
		return policy.Snapshot{}, 0
	}
	return r.snaps[len(r.snaps)-1], len(r.snaps)
}

// waitFor polls until cond holds on the latest snapshot, within the 2 s the
// daemon promises for policy changes.
func (r *recordingSink) waitFor(t *testing.T, what string, cond func(policy.Snapshot) bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if s, n := r.last(); n > 0 && cond(s) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s, _ := r.last()
	t.Fatalf("within 2s: %s; last snapshot has %d policies", what, len(s.Policies))
}

func names(s policy.Snapshot) map[string]bool {
	out := map[string]bool{}
	for _, np := range s.Policies {
		out[np.Namespace+"/"+np.Name] = true
	}
	return out
}

const policyA = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: a}\nspec: {podSelector: {}}\n"
const policyB = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: b, namespace: x}\nspec: {podSelector: {}}\n"

func TestStandaloneWatchesDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		// Write then rename, as editors and ConfigMap updates do.
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", policyA)
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("not policy"), 0o644); err != nil {
		t.Fatal(err)
	}

	src := NewStandalone(dir, zaptest.NewLogger(t))
	sink := &recordingSink{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	select {
	case <-src.Synced():
	case <-time.After(2 * time.Second):
		t.Fatal("not synced")
	}
	sink.waitFor(t, "initial policy", func(s policy.Snapshot) bool { return names(s)["default/a"] && len(s.Policies) == 1 })

	write("b.yml", policyB)
	sink.waitFor(t, "added file", func(s policy.Snapshot) bool { return names(s)["x/b"] && names(s)["default/a"] })

	// Breaking a file keeps its last valid policy and the others.
	write("b.yml", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: b}\nspec: {podSelector: {}, policyTypes: [Sideways]}\n")
	time.Sleep(3 * DefaultDebounce)
	sink.waitFor(t, "broken file keeps last content", func(s policy.Snapshot) bool { return names(s)["x/b"] && names(s)["default/a"] })
	if got := testutil.ToFloat64(src.invalid); got != 1 {
		t.Fatalf("invalid files gauge = %v, want 1", got)
	}
	if errs := src.Errors(); len(errs) != 1 || errs["b.yml"] == "" {
		t.Fatalf("Errors() = %v", errs)
	}
	if testutil.ToFloat64(src.fileErrors) < 1 {
		t.Fatal("file error not counted")
	}

	// Fixing it clears the error; deleting a file removes its policies.
	write("b.yml", policyB)
	if err := os.Remove(filepath.Join(dir, "a.yaml")); err != nil {
		t.Fatal(err)
	}
	sink.waitFor(t, "deleted file", func(s policy.Snapshot) bool { return !names(s)["default/a"] && names(s)["x/b"] })
	if got := testutil.ToFloat64(src.invalid); got != 0 {
		t.Fatalf("invalid files gauge = %v, want 0", got)
	}
}

func TestStandaloneMissingDir(t *testing.T) {
	src := NewStandalone(filepath.Join(t.TempDir(), "nope"), nil)
	if err := src.Run(context.Background(), &recordingSink{}); err == nil {
		t.Fatal("Run on a missing directory succeeded")
	}
}

// runOnce starts src, waits for its first snapshot and stops it.
func runOnce(t *testing.T, src *Standalone) policy.Snapshot {
	t.Helper()
	sink := &recordingSink{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()
	select {
	case <-src.Synced():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(2 * time.Second):
		t.Fatal("not synced")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	s, _ := sink.last()
	return s
}

// TestLastValidSurvivesRestart: a file that is broken when the daemon
// starts keeps enforcing the last valid content an earlier run saw, and a
// file deleted while the daemon was down takes its saved copy with it.
func TestLastValidSurvivesRestart(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", policyA)
	write("b.yaml", policyB)
	first := NewStandalone(dir, zaptest.NewLogger(t))
	first.StateDir = state
	if got := names(runOnce(t, first)); !got["default/a"] || !got["x/b"] {
		t.Fatalf("first run: %v", got)
	}

	// While the daemon is down, a.yaml breaks and b.yaml is deleted.
	write("a.yaml", policyA+"spec: {podSelector: {}, policyTypes: [Sideways]}\n")
	if err := os.Remove(filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	second := NewStandalone(dir, zaptest.NewLogger(t))
	second.StateDir = state
	got := names(runOnce(t, second))
	if !got["default/a"] {
		t.Fatalf("broken at start-up: last valid policy default/a dropped (got %v)", got)
	}
	if got["x/b"] {
		t.Fatalf("deleted file's policy came back: %v", got)
	}
	if errs := second.Errors(); errs["a.yaml"] == "" {
		t.Fatalf("broken file not reported: %v", errs)
	}

	// Without a state dir nothing is kept (the behaviour before).
	third := NewStandalone(dir, zaptest.NewLogger(t))
	if got := names(runOnce(t, third)); got["default/a"] {
		t.Fatalf("no state dir, yet default/a enforced: %v", got)
	}
}
