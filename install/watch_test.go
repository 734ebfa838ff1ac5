package install

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/coordino/coordino/conflist"
)

const testDebounce = 200 * time.Millisecond

// startWatch runs Watch until the test ends and returns once it is ready.
func startWatch(t *testing.T, in *Installer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- in.Watch(ctx, WatchOptions{Debounce: testDebounce, Ready: func() { close(ready) }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Watch ended early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Watch not ready after 10s")
	}
}

// eventually polls cond until it holds or 10s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settle waits long enough for any pending debounced reconcile to have run.
func settle() { time.Sleep(4 * testDebounce) }

// revise returns the primary config with a new top-level key, the kind of
// change a CNI makes when it rewrites its file (a new MTU, a new node name).
func revise(t *testing.T, data []byte, file string, rev int) []byte {
	t.Helper()
	out := bytes.Replace(data, []byte("{"), []byte(fmt.Sprintf(`{"x-revision": %d, `, rev)), 1)
	if _, err := conflist.Parse(out, file); err != nil {
		t.Fatalf("revised fixture invalid: %v", err)
	}
	return out
}

func TestWatchChained(t *testing.T) {
	for _, sh := range shapes {
		t.Run(sh.file, func(t *testing.T) {
			t.Parallel()
			n := newNode(t)
			orig := n.addPrimary(t, sh.file)
			primaryPath := filepath.Join(n.conf, sh.file)
			in := n.installer(t, ModeChained, conflist.Knobs{MTU: 1400})
			startWatch(t, in)
			chained := func() []byte { b, _ := os.ReadFile(in.ConfPath()); return b }
			expect := func(primary []byte) []byte {
				out, _, err := conflist.InsertCoordino(primary, sh.file, conflist.Knobs{MTU: 1400})
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			if !bytes.Equal(chained(), expect(orig)) {
				t.Fatal("initial chain missing")
			}

			// A burst of rewrites by the primary CNI (as its installer does on
			// restart) is folded into one write of ours, with the final content.
			w0 := in.Writes()
			burstStart := time.Now()
			var last []byte
			for rev := 1; rev <= 10; rev++ {
				last = revise(t, orig, sh.file, rev)
				os.WriteFile(primaryPath, last, 0o644) // non-atomic, like many installers
			}
			burst := time.Since(burstStart)
			eventually(t, "chain to follow the primary", func() bool { return bytes.Equal(chained(), expect(last)) })
			settle()
			got := in.Writes() - w0
			if got != 1 && !(got == 2 && burst > testDebounce/2) {
				t.Fatalf("burst of 10 primary rewrites caused %d writes, want 1", got)
			}

			// Rewriting identical bytes causes no write.
			w0 = in.Writes()
			os.WriteFile(primaryPath, last, 0o644)
			settle()
			if d := in.Writes() - w0; d != 0 {
				t.Fatalf("identical primary rewrite caused %d writes", d)
			}

			// Someone deletes or edits our file: it comes back.
			os.Remove(in.ConfPath())
			eventually(t, "chain restored after delete", func() bool { return bytes.Equal(chained(), expect(last)) })
			os.WriteFile(in.ConfPath(), []byte(`{"name":"x","plugins":[{"type":"y"}]}`), 0o644)
			eventually(t, "chain restored after edit", func() bool { return bytes.Equal(chained(), expect(last)) })

			// The primary goes away: so does the chain; it comes back with it.
			os.Remove(primaryPath)
			eventually(t, "chain removed with its primary", func() bool { _, err := os.Stat(in.ConfPath()); return os.IsNotExist(err) })
			os.WriteFile(primaryPath, orig, 0o644)
			eventually(t, "chain back with its primary", func() bool { return bytes.Equal(chained(), expect(orig)) })
			if got, _ := os.ReadFile(primaryPath); !bytes.Equal(got, orig) {
				t.Fatal("watcher wrote the primary's file")
			}
		})
	}
}

// TestWatchNoWriteLoop runs the watcher next to a primary CNI that rewrites
// its own file whenever anything else in the conf dir changes (a pessimistic
// model of a CNI agent watching the dir). Each side reacting to the other must
// die out: we prove it by counting writes on both sides.
func TestWatchNoWriteLoop(t *testing.T) {
	n := newNode(t)
	orig := n.addPrimary(t, "10-calico.conflist")
	primaryPath := filepath.Join(n.conf, "10-calico.conflist")
	in := n.installer(t, ModeChained, conflist.Knobs{})
	startWatch(t, in)

	var primaryWrites atomic.Int64
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(n.conf); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			case ev := <-w.Events:
				if ev.Name == primaryPath || primaryWrites.Load() >= 500 {
					continue
				}
				primaryWrites.Add(1)
				os.WriteFile(primaryPath, orig, 0o644)
			case <-w.Errors:
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-stopped; w.Close() })

	w0 := in.Writes()
	os.Remove(in.ConfPath()) // provoke both sides
	eventually(t, "chain restored", func() bool { _, err := os.Stat(in.ConfPath()); return err == nil })
	settle()
	ours, theirs := in.Writes()-w0, primaryWrites.Load()
	// Quiet from here on: nobody writes anymore.
	time.Sleep(5 * testDebounce)
	if in.Writes()-w0 != ours || primaryWrites.Load() != theirs {
		t.Fatalf("still writing after settling: ours %d->%d, theirs %d->%d", ours, in.Writes()-w0, theirs, primaryWrites.Load())
	}
	if ours != 1 {
		t.Fatalf("we wrote %d times, want 1 (the restore)", ours)
	}
	if theirs >= 500 {
		t.Fatalf("the primary rewrote its file %d times: a loop", theirs)
	}
	t.Logf("restore: %d write of ours, %d reactive rewrites of the primary", ours, theirs)
}

func TestWatchPrimaryMode(t *testing.T) {
	n := newNode(t)
	in := n.installer(t, ModePrimary, conflist.Knobs{LogLevel: "warn"})
	startWatch(t, in)
	want, _ := conflist.Build(conflist.Options{Knobs: conflist.Knobs{LogLevel: "warn"}})
	ours := func() []byte { b, _ := os.ReadFile(in.ConfPath()); return b }
	if !bytes.Equal(ours(), want) {
		t.Fatal("conflist not written")
	}
	os.WriteFile(in.ConfPath(), []byte("{"), 0o644)
	eventually(t, "conflist restored after truncation", func() bool { return bytes.Equal(ours(), want) })
	os.Remove(in.ConfPath())
	eventually(t, "conflist restored after delete", func() bool { return bytes.Equal(ours(), want) })
	// Unrelated files come and go without writes. Settle first: the restore's
	// counter is bumped after its rename is already visible.
	settle()
	w0 := in.Writes()
	os.WriteFile(filepath.Join(n.conf, "99-other.conflist"), []byte(`{"name":"o","plugins":[{"type":"x"}]}`), 0o644)
	settle()
	if d := in.Writes() - w0; d != 0 {
		t.Fatalf("unrelated file caused %d writes", d)
	}
	if f, list := runtimeView(t, n.conf); f != "10-coordino.conflist" || !slices.Equal(types(list), []string{"coordino"}) {
		t.Fatalf("runtime uses %s", f)
	}
}

func TestWatchWaitsForPrimary(t *testing.T) {
	n := newNode(t)
	in := n.installer(t, ModeChained, conflist.Knobs{})
	startWatch(t, in) // no primary yet: Watch must not fail
	if _, err := os.Stat(filepath.Join(n.bin, "coordino")); err != nil {
		t.Fatalf("plugin not copied while waiting: %v", err)
	}
	n.addPrimary(t, "10-flannel.conflist")
	eventually(t, "chain once the primary appears", func() bool {
		f, list := runtimeView(t, n.conf)
		return f == "00-coordino-chained.conflist" && slices.Equal(types(list), []string{"flannel", "portmap", "coordino"})
	})
}
