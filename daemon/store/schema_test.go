package store

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/coordino/coordino/internal/schema"
)

// writeStore writes a store file as another version would: one endpoint
// record and, unless stamp is nil, a schema stamp.
func writeStore(t *testing.T, dir string, stamp *schema.Stamp) string {
	t.Helper()
	path := filepath.Join(dir, "endpoints.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rec, _ := json.Marshal(&Endpoint{Key: Key{"net1", "c1", "eth0"}, Mode: ModePrimary, Generation: 7})
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(bucketEndpoints)
		if err != nil {
			return err
		}
		if err := b.Put([]byte("net1/c1/eth0"), rec); err != nil {
			return err
		}
		if stamp == nil {
			return nil
		}
		m, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return err
		}
		data, _ := json.Marshal(stamp)
		return m.Put(keySchema, data)
	}); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestOpenRefusesNewerStoreAndLeavesItUntouched(t *testing.T) {
	dir := t.TempDir()
	path := writeStore(t, dir, &schema.Stamp{Version: Format.Current + 5, MinReader: Format.Current + 1})
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir)
	if err == nil {
		s.Close()
		t.Fatal("Open accepted a store it cannot read")
	}
	for _, want := range []string{path, "schema version 7", "readable by version 3", "reads versions up to 2", "leaving it untouched"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Fatal("the refused store file changed")
	}
}

func TestOpenReadsNewerAdditiveStoreKeepingItsStamp(t *testing.T) {
	dir := t.TempDir()
	newer := schema.Stamp{Version: Format.Current + 1, MinReader: Format.Current}
	writeStore(t, dir, &newer)
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ep, err := s.Get(Key{"net1", "c1", "eth0"}); err != nil || ep.Generation != 7 {
		t.Fatalf("record of the newer store: %+v, %v", ep, err)
	}
	if st, err := s.Schema(); err != nil || st != newer {
		t.Fatalf("stamp after open = %+v, %v; want the newer %+v kept", st, err, newer)
	}
}

func TestOpenMigratesUnversionedStore(t *testing.T) {
	dir := t.TempDir()
	writeStore(t, dir, nil) // as the releases before stamps wrote it
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st, err := s.Schema(); err != nil || st != Format.Stamp() {
		t.Fatalf("stamp after migration = %+v, %v; want %+v", st, err, Format.Stamp())
	}
	if ep, err := s.Get(Key{"net1", "c1", "eth0"}); err != nil || ep.Generation != 7 || ep.Mode != ModePrimary {
		t.Fatalf("record after migration: %+v, %v", ep, err)
	}
}

func TestOpenStampsNewStore(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st, err := s.Schema(); err != nil || st != Format.Stamp() {
		t.Fatalf("stamp of a new store = %+v, %v", st, err)
	}
}

func TestCheckSchema(t *testing.T) {
	if err := CheckSchema(t.TempDir()); err != nil {
		t.Fatalf("no store: %v", err)
	}
	dir := t.TempDir()
	path := writeStore(t, dir, &schema.Stamp{Version: 9, MinReader: 9})
	before, _ := os.ReadFile(path)
	if err := CheckSchema(dir); !schema.IsTooNew(err) {
		t.Fatalf("store too new: %v", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("CheckSchema changed the store")
	}
	dir = t.TempDir()
	writeStore(t, dir, nil)
	if err := CheckSchema(dir); err != nil {
		t.Fatalf("unstamped store: %v", err)
	}
}
