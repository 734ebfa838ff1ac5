// Package deletequeue holds CNI DEL requests the plugin could not deliver to
// the daemon. The plugin writes one fsynced file per request, in a
// subdirectory named for the request's attachment (KeyDir), so that an ADD
// finds the DELs of its own attachment with one lookup whatever the backlog;
// the daemon replays and removes them all before it serves, and periodically
// after.
package deletequeue

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/coordino/coordino/internal/schema"
	"github.com/coordino/coordino/proto/cni/v1/wire"
)

// Format is the queue records' layout. Version 1 (unstamped) is that of
// the releases before stamps; version 2 adds the stamp's fields, which
// version 1 skips as unknown.
var Format = schema.Format{What: "queued DEL", Current: 2, MinReader: 1}

const (
	suffix = ".del"
	// keyDirPrefix starts the name of every per-attachment subdirectory.
	keyDirPrefix = "k-"
)

// KeyDir is the subdirectory of the queue that holds the DELs of the
// attachment (network name, container ID, interface name). It is a hash:
// the names are the runtime's, and two attachments sharing a directory only
// means a lookup decodes the other's entries too, never that it applies them.
func KeyDir(network, containerID, ifName string) string {
	h := fnv.New64a()
	for _, part := range []string{network, containerID, ifName} {
		h.Write([]byte(part))
		h.Write([]byte{0}) // no separator can occur in all three
	}
	return keyDirPrefix + strconv.FormatUint(h.Sum64(), 16)
}

// networkName is the "name" of a network config, as the daemon reads it.
func networkName(stdin []byte) string {
	var conf struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(stdin, &conf) // a config the daemon cannot parse is set aside by the drain
	return conf.Name
}

// Write stores req durably in the key directory of its attachment (the
// network name is read from req.Stdin): written to a temporary file,
// fsynced, then renamed, and both directories fsynced, so the daemon never
// reads a partial entry and a crash loses no acknowledged one.
func Write(dir string, req *wire.Request) error {
	keyDir := filepath.Join(dir, KeyDir(networkName(req.Stdin), req.ContainerID, req.IfName))
	now := time.Now()
	data, err := wire.AppendQueuedDelete(nil, req, now.UnixNano(), Format.Stamp())
	if err != nil {
		return fmt.Errorf("encode queue entry: %w", err)
	}
	var tmp *os.File
	// The daemon removes a key directory it emptied; one removed between
	// our MkdirAll and CreateTemp is created again.
	for attempt := 0; ; attempt++ {
		if err := os.MkdirAll(keyDir, 0o700); err != nil {
			return fmt.Errorf("create delete queue %s: %w", keyDir, err)
		}
		var err error
		tmp, err = os.CreateTemp(keyDir, ".tmp-*")
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrNotExist) || attempt == 3 {
			return fmt.Errorf("create queue entry in %s: %w", keyDir, err)
		}
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
	final := filepath.Join(keyDir, fmt.Sprintf("%020d-%s%s", now.UnixNano(), strings.TrimPrefix(filepath.Base(tmp.Name()), ".tmp-"), suffix))
	if err := os.Rename(tmp.Name(), final); err != nil {
		return fmt.Errorf("commit queue entry %s: %w", final, err)
	}
	// The entry's name, then the key directory's (it may be new).
	if err := syncDir(keyDir); err != nil {
		return err
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

// Decode parses the content of the queue file at path; a record too new
// for this build is a *schema.TooNewError.
func Decode(path string, data []byte) (*wire.Request, time.Time, error) {
	req, at, st, err := wire.DecodeQueuedDelete(data)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("decode queued DEL: %w", err)
	}
	// Versions 1 and 2 hold the same request: nothing to migrate.
	if _, err := Format.Check(path, st); err != nil {
		return nil, time.Time{}, err
	}
	if req == nil || req.ContainerID == "" {
		return nil, time.Time{}, errors.New("decode queued DEL: no request or container ID")
	}
	return req, time.Unix(0, at), nil
}

// Remove deletes the entry's file, and its key directory once that is
// empty; an entry already removed is not an error.
func (e Entry) Remove() error {
	if err := os.Remove(e.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", e.Path, err)
	}
	if parent := filepath.Dir(e.Path); strings.HasPrefix(filepath.Base(parent), keyDirPrefix) {
		_ = os.Remove(parent) // fails while other entries (or set-aside ones) remain
	}
	return nil
}

// ErrUnusable marks an entry that can never be applied; Drain sets it aside.
var ErrUnusable = errors.New("unusable queued DEL")

// Paths lists every queued entry file in queue order (by the time in its
// name): those in key directories and those a plugin from before key
// directories wrote at the top of dir. A missing dir is an empty queue.
func Paths(dir string) ([]string, error) {
	top, err := readDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, d := range top {
		switch {
		case d.IsDir() && strings.HasPrefix(d.Name(), keyDirPrefix):
			sub, err := entryFiles(filepath.Join(dir, d.Name()))
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
		case isEntry(d):
			out = append(out, filepath.Join(dir, d.Name()))
		}
	}
	sort.Slice(out, func(i, j int) bool { return filepath.Base(out[i]) < filepath.Base(out[j]) })
	return out, nil
}

func isEntry(d os.DirEntry) bool { return d.Type().IsRegular() && strings.HasSuffix(d.Name(), suffix) }

// readDir lists a queue directory; a missing one is empty.
func readDir(dir string) ([]os.DirEntry, error) {
	names, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read delete queue %s: %w", dir, err)
	}
	return names, nil
}

// entryFiles lists the committed entry files directly in dir; a missing dir
// has none.
func entryFiles(dir string) ([]string, error) {
	names, err := readDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		if isEntry(n) {
			out = append(out, filepath.Join(dir, n.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

// ForKey returns the decodable queued DELs in the key directory of one
// attachment, in queue order, leaving them queued: one directory lookup,
// which finds nothing (ENOENT) when the attachment has none, however long
// the queue is. The rare attachment whose key hashes alike shares the
// directory, so callers compare each entry's key with their own. An entry
// that vanishes or cannot be read meanwhile is skipped. Entries a plugin
// from before key directories wrote are not looked at: the drain before
// serving applies them. An entry too new for this build to read fails the
// lookup (a *schema.TooNewError): it may be the attachment's own DEL.
func ForKey(dir, network, containerID, ifName string) ([]Entry, error) {
	paths, err := entryFiles(filepath.Join(dir, KeyDir(network, containerID, ifName)))
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		req, at, err := Decode(path, data)
		if schema.IsTooNew(err) {
			// It may be this attachment's DEL: an ADD must not go first.
			return nil, err
		}
		if err == nil {
			out = append(out, Entry{Path: path, Request: req, QueuedAt: at})
		}
	}
	return out, nil
}

// Drain calls apply for every queued DEL in queue order and removes each entry
// apply accepts (apply may have removed it already). An entry that cannot be
// decoded is moved aside (".bad") so it is neither lost nor retried forever,
// as is one apply rejects with ErrUnusable; an entry apply fails otherwise
// stays queued for the next drain, as does one too new for this build to
// read (left for a build that reads it).
func Drain(dir string, apply func(Entry) error) (applied int, errs []error) {
	paths, err := Paths(dir)
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
		req, at, err := Decode(path, data)
		if schema.IsTooNew(err) {
			errs = append(errs, err) // stays queued for a build that reads it
			continue
		}
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
