package deletequeue

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/coordino/coordino/proto/cni/v1/wire"
)

func TestWriteDrainInOrder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "q")
	for _, id := range []string{"a", "b", "c"} {
		if err := Write(dir, &wire.Request{ContainerID: id, IfName: "eth0", Stdin: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
	}
	fi, _ := os.Stat(dir)
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("queue dir mode %v", fi.Mode())
	}
	var seen []string
	failB := true
	n, errs := Drain(dir, func(e Entry) error {
		seen = append(seen, e.Request.ContainerID)
		if e.Request.ContainerID == "b" && failB {
			return errors.New("transient")
		}
		if e.QueuedAt.IsZero() {
			t.Fatal("no queue time")
		}
		return nil
	})
	if n != 2 || len(errs) != 1 || len(seen) != 3 || seen[0] != "a" || seen[2] != "c" {
		t.Fatalf("first drain: n=%d errs=%v seen=%v", n, errs, seen)
	}
	// The failed entry stays for the next drain.
	failB = false
	seen = nil
	if n, errs := Drain(dir, func(e Entry) error { seen = append(seen, e.Request.ContainerID); return nil }); n != 1 || len(errs) != 0 || seen[0] != "b" {
		t.Fatalf("second drain: n=%d errs=%v seen=%v", n, errs, seen)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

func TestCorruptAndUnusableEntriesAreSetAside(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "1-x.del"), []byte("garbage"), 0o600)
	Write(dir, &wire.Request{ContainerID: "u"})
	n, errs := Drain(dir, func(Entry) error { return ErrUnusable })
	if n != 0 || len(errs) != 2 {
		t.Fatalf("n=%d errs=%v", n, errs)
	}
	bad, _ := filepath.Glob(filepath.Join(dir, "*.bad"))
	if len(bad) != 2 {
		t.Fatalf("set aside: %v", bad)
	}
	if n, errs := Drain(dir, func(Entry) error { t.Fatal("retried a set-aside entry"); return nil }); n != 0 || len(errs) != 0 {
		t.Fatal(n, errs)
	}
}

func TestMissingQueueIsEmpty(t *testing.T) {
	if n, errs := Drain(filepath.Join(t.TempDir(), "none"), nil); n != 0 || errs != nil {
		t.Fatal(n, errs)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte("garbage"))
	f.Add([]byte{0x0a, 0x03, 0x0a, 0x01, 0x61})
	f.Fuzz(func(t *testing.T, data []byte) {
		req, _, err := Decode(data)
		if err == nil && (req == nil || req.ContainerID == "") {
			t.Fatal("accepted an entry without a container ID")
		}
	})
}
