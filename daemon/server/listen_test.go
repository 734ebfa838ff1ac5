package server

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// TestListenNeverShowsAnotherMode: the socket appears at its path with
// mode 0600 or not at all; the plugin refuses any other mode, so a socket
// visible between bind and chmod failed ADDs during a daemon's start.
func TestListenNeverShowsAnotherMode(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "run", "coordino.sock")
	var stop atomic.Bool
	var seen atomic.Uint32
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if fi, err := os.Lstat(sock); err == nil && fi.Mode().Perm() != 0o600 {
				seen.Store(uint32(fi.Mode().Perm()))
			}
		}
	}()
	for i := 0; i < 300 && seen.Load() == 0; i++ {
		l, err := Listen(sock)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(sock); !os.IsNotExist(err) {
			t.Fatalf("socket left after Close: %v", err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if m := seen.Load(); m != 0 {
		t.Fatalf("socket seen with mode %#o", m)
	}
}
