package store

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Writes that arrive while a commit is in flight share the next one: a Put
// that leads (its own commit, waiting behind a held transaction) and 15
// Puts queued meanwhile take two commits, and each gets its own generation.
func TestConcurrentWritesShareCommits(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	// Before Close, which would wait for the held transaction forever if
	// the test failed before releasing it.
	defer unblock()
	held := make(chan struct{})
	go s.db.Update(func(*bolt.Tx) error { close(held); <-release; return nil })
	<-held
	before := s.group.commits.Load()
	waitForGroup := func(what string, done func(g *groupCommit) bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			s.group.mu.Lock()
			ok := done(&s.group)
			queued := len(s.group.pending)
			s.group.mu.Unlock()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s: %d writes queued", what, queued)
			}
		}
	}

	const n = 16
	eps := make([]*Endpoint, n)
	for i := range eps {
		eps[i] = &Endpoint{Key: Key{"net", fmt.Sprintf("c%02d", i), "eth0"}, Mode: ModePrimary}
	}
	errs := make(chan error, n)
	var wg sync.WaitGroup
	put := func(ep *Endpoint) {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- s.Put(ep) }()
	}
	// The first Put leads: it takes the pending writes (itself alone, once
	// nothing else has started) and waits for the held transaction.
	put(eps[0])
	waitForGroup("the first Put to lead", func(g *groupCommit) bool { return g.busy && len(g.pending) == 0 })
	// The others queue behind it.
	for _, ep := range eps[1:] {
		put(ep)
	}
	waitForGroup("the other Puts to queue", func(g *groupCommit) bool { return len(g.pending) == n-1 })
	unblock()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := s.group.commits.Load() - before; got != 2 {
		t.Errorf("16 concurrent Puts took %d commits, want 2", got)
	}
	gens := map[uint64]bool{}
	for _, ep := range eps {
		got, err := s.Get(ep.Key)
		if err != nil {
			t.Fatal(err)
		}
		if got.Generation == 0 || got.Generation != ep.Generation || gens[got.Generation] {
			t.Fatalf("%s: stored generation %d, returned %d (seen before: %t)", ep.Key, got.Generation, ep.Generation, gens[got.Generation])
		}
		gens[got.Generation] = true
	}
}

// A write that fails leaves the others of its group committed.
func TestFailedWriteLeavesItsGroupCommitted(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	bad := fmt.Errorf("bad write")
	batch := []*write{
		{fn: func(tx *bolt.Tx) error { return tx.Bucket(bucketEndpoints).Put([]byte("a"), []byte("1")) }, done: make(chan error, 1)},
		{fn: func(tx *bolt.Tx) error { _ = tx.Bucket(bucketEndpoints).Put([]byte("b"), []byte("2")); return bad }, done: make(chan error, 1)},
		{fn: func(tx *bolt.Tx) error { return tx.Bucket(bucketEndpoints).Put([]byte("c"), []byte("3")) }, done: make(chan error, 1)},
	}
	s.commitBatch(batch)
	for i, want := range []error{nil, bad, nil} {
		if got := <-batch[i].done; got != want {
			t.Errorf("write %d: %v, want %v", i, got, want)
		}
	}
	_ = s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEndpoints)
		if b.Get([]byte("a")) == nil || b.Get([]byte("c")) == nil || b.Get([]byte("b")) != nil {
			t.Errorf("after the group: a=%q b=%q c=%q, want a and c only", b.Get([]byte("a")), b.Get([]byte("b")), b.Get([]byte("c")))
		}
		return nil
	})
}

const crashWriterEnv = "COORDINO_STORE_CRASH_WRITER"

// The store is killed (SIGKILL) while 16 writers Put concurrently; every
// Put that returned before the kill is in the store after reopening, and
// the file passes bbolt's consistency check.
func TestKilledDuringGroupCommitsLosesNoAcknowledgedWrite(t *testing.T) {
	if dir := os.Getenv(crashWriterEnv); dir != "" {
		crashWriter(dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledDuringGroupCommitsLosesNoAcknowledgedWrite$")
	cmd.Env = append(os.Environ(), crashWriterEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := map[string]bool{}
	sc := bufio.NewScanner(out)
	for sc.Scan() && len(acked) < 300 {
		if k, ok := strings.CutPrefix(sc.Text(), "acked "); ok {
			acked[k] = true
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	for sc.Scan() { // acknowledged before the kill landed
		if k, ok := strings.CutPrefix(sc.Text(), "acked "); ok {
			acked[k] = true
		}
	}
	_ = cmd.Wait()
	if len(acked) < 300 {
		t.Fatalf("writer acknowledged only %d Puts", len(acked))
	}

	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	}); err != nil {
		t.Fatalf("store inconsistent after the kill: %v", err)
	}
	eps, err := s.List("")
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]bool{}
	for _, ep := range eps {
		stored[ep.ContainerID] = true
	}
	for k := range acked {
		if !stored[k] {
			t.Errorf("acknowledged Put of %s lost", k)
		}
	}
}

// crashWriter Puts from 16 goroutines until killed, printing each Put that returned.
func crashWriter(dir string) {
	s, err := Open(dir)
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	var mu sync.Mutex
	for w := 0; w < 16; w++ {
		go func() {
			for i := 0; ; i++ {
				id := fmt.Sprintf("w%02d-%06d", w, i)
				if err := s.Put(&Endpoint{Key: Key{"net", id, "eth0"}, Mode: ModePrimary}); err != nil {
					fmt.Println("put:", err)
					os.Exit(1)
				}
				mu.Lock()
				fmt.Println("acked " + id)
				mu.Unlock()
			}
		}()
	}
	select {}
}
