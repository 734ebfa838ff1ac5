package deletequeue

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coordino/coordino/internal/schema"
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
	keyed, _ := filepath.Glob(filepath.Join(dir, "*", "*.bad"))
	bad = append(bad, keyed...)
	if len(bad) != 2 {
		t.Fatalf("set aside: %v", bad)
	}
	if n, errs := Drain(dir, func(Entry) error { t.Fatal("retried a set-aside entry"); return nil }); n != 0 || len(errs) != 0 {
		t.Fatal(n, errs)
	}
}

// Entries live in the key directory of their attachment, ForKey finds an
// attachment's without looking at the others', and the drain takes every
// entry, key directories and the flat layout of older plugins alike, in
// queue order across both.
func TestKeyDirectories(t *testing.T) {
	dir := t.TempDir()
	conf := func(name string) []byte {
		return []byte(`{"cniVersion":"1.1.0","name":"` + name + `","type":"coordino"}`)
	}
	// An entry an older plugin wrote at the top, queued first.
	legacy, err := wire.AppendQueuedDelete(nil, &wire.Request{ContainerID: "old", IfName: "eth0", Stdin: conf("n1")}, 1, schema.Stamp{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "00000000000000000001-x.del"), legacy, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct{ net, id string }{{"n1", "a"}, {"n2", "a"}, {"n1", "b"}, {"n1", "a"}} {
		if err := Write(dir, &wire.Request{ContainerID: w.id, IfName: "eth0", Stdin: conf(w.net)}); err != nil {
			t.Fatal(err)
		}
	}
	if KeyDir("n1", "a", "eth0") == KeyDir("n2", "a", "eth0") || KeyDir("n1", "ab", "c") == KeyDir("n1", "a", "bc") {
		t.Fatal("distinct attachments share a key directory")
	}
	got, err := ForKey(dir, "n1", "a", "eth0")
	if err != nil || len(got) != 2 || got[0].Path >= got[1].Path {
		t.Fatalf("ForKey(n1/a/eth0) = %v, %v; want its two entries in queue order", got, err)
	}
	for _, e := range got {
		if filepath.Dir(e.Path) != filepath.Join(dir, KeyDir("n1", "a", "eth0")) || e.Request.ContainerID != "a" {
			t.Fatalf("entry %s (%s) is not in the key directory of n1/a/eth0", e.Path, e.Request.ContainerID)
		}
	}
	if got, err := ForKey(dir, "n3", "a", "eth0"); err != nil || len(got) != 0 {
		t.Fatalf("ForKey of an attachment with nothing queued = %v, %v", got, err)
	}
	var order []string
	n, errs := Drain(dir, func(e Entry) error {
		order = append(order, networkName(e.Request.Stdin)+"/"+e.Request.ContainerID)
		return nil
	})
	if n != 5 || len(errs) != 0 || order[0] != "n1/old" || order[1] != "n1/a" || order[2] != "n2/a" || order[3] != "n1/b" || order[4] != "n1/a" {
		t.Fatalf("drain: n=%d errs=%v order=%v", n, errs, order)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("drained queue keeps %v", left)
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
		req, _, err := Decode("fuzz.del", data)
		if err == nil && (req == nil || req.ContainerID == "") {
			t.Fatal("accepted an entry without a container ID")
		}
	})
}

// The key directory of any queued request, whatever its config holds, is
// one safe path element under the queue, and the same for the same request.
func FuzzKeyDirOfRequest(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.1.0","name":"n1","type":"coordino"}`), "c1", "eth0")
	f.Add([]byte(`{"name":"../.."}`), "../x", "a/b")
	f.Add([]byte("garbage"), "", "")
	f.Fuzz(func(t *testing.T, stdin []byte, containerID, ifName string) {
		d := KeyDir(networkName(stdin), containerID, ifName)
		if !strings.HasPrefix(d, keyDirPrefix) || strings.ContainsAny(d, "/\x00") || d != filepath.Base(d) {
			t.Fatalf("key directory %q is not one safe path element", d)
		}
		if d != KeyDir(networkName(stdin), containerID, ifName) {
			t.Fatal("key directory not deterministic")
		}
	})
}

// Records carry the queue's stamp. One from a release before stamps, or a
// newer additive one, is replayed; one too new for this build stays queued,
// byte for byte, and makes an ADD of its attachment's key wait (its DEL
// must not come after the ADD).
func TestQueueRecordSchema(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, &wire.Request{ContainerID: "now", IfName: "eth0", Stdin: []byte(`{"name":"n"}`)}); err != nil {
		t.Fatal(err)
	}
	got, err := ForKey(dir, "n", "now", "eth0")
	if err != nil || len(got) != 1 {
		t.Fatalf("ForKey = %v, %v", got, err)
	}
	data, _ := os.ReadFile(got[0].Path)
	if _, _, st, err := wire.DecodeQueuedDelete(data); err != nil || st != Format.Stamp() {
		t.Fatalf("written stamp %+v, %v; want %+v", st, err, Format.Stamp())
	}
	put := func(id string, st schema.Stamp) string {
		t.Helper()
		keyDir := filepath.Join(dir, KeyDir("n", id, "eth0"))
		if err := os.MkdirAll(keyDir, 0o700); err != nil {
			t.Fatal(err)
		}
		data, err := wire.AppendQueuedDelete(nil, &wire.Request{ContainerID: id, IfName: "eth0", Stdin: []byte(`{"name":"n"}`)}, 1, st)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(keyDir, "00000000000000000001-"+id+".del")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	put("old", schema.Stamp{})
	put("additive", schema.Stamp{Version: Format.Current + 1, MinReader: Format.Current})
	tooNew := put("future", schema.Stamp{Version: Format.Current + 2, MinReader: Format.Current + 2})
	before, _ := os.ReadFile(tooNew)

	if _, err := ForKey(dir, "n", "future", "eth0"); !schema.IsTooNew(err) || !strings.Contains(err.Error(), "queued DEL "+tooNew+" has schema version 4, readable by version 4") {
		t.Fatalf("ForKey of the key with a record too new: %v", err)
	}
	var applied []string
	n, errs := Drain(dir, func(e Entry) error {
		applied = append(applied, e.Request.ContainerID)
		return nil
	})
	if n != 3 || len(errs) != 1 || !schema.IsTooNew(errs[0]) {
		t.Fatalf("Drain applied %d %v, errors %v; want 3 and the too-new record refused", n, applied, errs)
	}
	if after, err := os.ReadFile(tooNew); err != nil || string(after) != string(before) {
		t.Fatalf("the record too new did not stay queued as it was: %v", err)
	}
}
