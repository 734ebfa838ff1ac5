package peers

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestFileSourceIgnoresBrokenFile: a file that does not parse never reaches
// the consumer (it would withdraw routes); the next good one does.
func TestFileSourceIgnoresBrokenFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "peers.yaml")
	write := func(s string) {
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sets := make(chan Set, 10)
	src := &File{Path: path, Log: zap.NewNop()}
	go func() { _ = src.Run(ctx, func(s Set) { sets <- s }) }()
	next := func(wait time.Duration) Set {
		select {
		case s := <-sets:
			return s
		case <-time.After(wait):
			return nil
		}
	}
	if s := next(5 * time.Second); s == nil || len(s) != 0 {
		t.Fatalf("missing file: want an empty set, got %v", s)
	}
	write(`nodes: [{name: a, addresses: [192.0.2.1], blocks: [10.1.0.0/24]}]`)
	if s := next(5 * time.Second); s == nil || s["a"] == nil {
		t.Fatalf("first file: %v", s)
	}
	write(`nodes: [{name: a, addresses: [192.0.2.1], blocks: [10.1.0.1/24]}]`)
	if s := next(time.Second); s != nil {
		t.Fatalf("broken file applied: %v", s.Names())
	}
	write(`nodes: [{name: a, addresses: [192.0.2.1], blocks: [10.1.0.0/24]}, {name: b, addresses: [192.0.2.2], blocks: [10.2.0.0/24]}]`)
	if s := next(5 * time.Second); s == nil || len(s) != 2 {
		t.Fatalf("fixed file: %v", s)
	}
}
