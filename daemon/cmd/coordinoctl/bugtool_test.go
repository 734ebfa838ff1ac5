package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"testing"
	"time"
)

// Entries are never stamped after the moment the report was taken: tar
// keeps whole seconds, and rounding 12:00:00.7 up is a time in the future.
func TestTarballEntriesAreNotInTheFuture(t *testing.T) {
	now := time.Date(2026, 1, 2, 12, 0, 0, 700_000_000, time.UTC)
	var buf bytes.Buffer
	tb := newTarball(&buf, "report", now)
	if err := tb.add("status.json", []byte("{}\n")); err != nil {
		t.Fatal(err)
	}
	if err := tb.close(); err != nil {
		t.Fatal(err)
	}
	gz, err := gzip.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	h, err := tar.NewReader(gz).Next()
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if h.Name != "report/status.json" || h.ModTime.After(now) || now.Sub(h.ModTime) >= time.Second {
		t.Fatalf("entry %s stamped %v for a report taken at %v", h.Name, h.ModTime, now)
	}
}
