// Package deletequeue holds CNI DEL requests the plugin could not deliver to
// the daemon. The plugin writes one fsynced file per request; the daemon
// replays and removes them before it serves, and periodically after.
package deletequeue

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/coordino/coordino/proto/cni/v1/wire"
)

const suffix = ".del"

// Write stores req durably in dir: written to a temporary file, fsynced, then
// renamed, so the daemon never reads a partial entry.
func Write(dir string, req *wire.Request) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create delete queue %s: %w", dir, err)
	}
	now := time.Now()
	data := wire.AppendQueuedDelete(nil, req, now.UnixNano())
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("create queue entry in %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write queue entry %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("fsync queue entry %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close queue entry %s: %w", tmp.Name(), err)
	}
	// Nanosecond time first keeps replay in queue order; the temp name keeps it unique.
	final := filepath.Join(dir, fmt.Sprintf("%020d-%s%s", now.UnixNano(), strings.TrimPrefix(filepath.Base(tmp.Name()), ".tmp-"), suffix))
	if err := os.Rename(tmp.Name(), final); err != nil {
		return fmt.Errorf("commit queue entry %s: %w", final, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

// Entry is one queued DEL.
type Entry struct {
	Path     string
	Request  *wire.Request
	QueuedAt time.Time
}

// Decode parses a queue file's content.
func Decode(data []byte) (*wire.Request, time.Time, error) {
	req, at, err := wire.DecodeQueuedDelete(data)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("decode queued DEL: %w", err)
	}
	if req == nil || req.ContainerID == "" {
		return nil, time.Time{}, errors.New("decode queued DEL: no request or container ID")
	}
	return req, time.Unix(0, at), nil
}

// Remove deletes the entry's file; an entry already removed is not an error.
func (e Entry) Remove() error {
	if err := os.Remove(e.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", e.Path, err)
	}
	return nil
}

// ErrUnusable marks an entry that can never be applied; Drain sets it aside.
var ErrUnusable = errors.New("unusable queued DEL")

// files lists the queue's entry files in queue order.
func files(dir string) ([]string, error) {
	names, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("read delete queue %s: %w", dir, err)
	}
	var out []string
	for _, n := range names {
		if n.Type().IsRegular() && strings.HasSuffix(n.Name(), suffix) {
			out = append(out, filepath.Join(dir, n.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

// List returns the decodable queued DELs in queue order, leaving them queued.
// An entry that vanishes or cannot be read meanwhile is skipped.
func List(dir string) ([]Entry, error) {
	paths, err := files(dir)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		if req, at, err := Decode(data); err == nil {
			out = append(out, Entry{Path: path, Request: req, QueuedAt: at})
		}
	}
	return out, nil
}

// Drain calls apply for every queued DEL in queue order and removes each entry
// apply accepts (apply may have removed it already). An entry that cannot be
// decoded is moved aside (".bad") so it is neither lost nor retried forever,
// as is one apply rejects with ErrUnusable; an entry apply fails otherwise
// stays queued for the next drain.
func Drain(dir string, apply func(Entry) error) (applied int, errs []error) {
	paths, err := files(dir)
	if err != nil {
		return 0, []error{err}
	}
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue // applied meanwhile
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", path, err))
			continue
		}
		req, at, err := Decode(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			_ = os.Rename(path, path+".bad")
			continue
		}
		e := Entry{Path: path, Request: req, QueuedAt: at}
		if err := apply(e); err != nil {
			errs = append(errs, fmt.Errorf("replay %s: %w", path, err))
			if errors.Is(err, ErrUnusable) {
				_ = os.Rename(path, path+".bad")
			}
			continue
		}
		if err := e.Remove(); err != nil {
			errs = append(errs, err)
			continue
		}
		applied++
	}
	return applied, errs
}
