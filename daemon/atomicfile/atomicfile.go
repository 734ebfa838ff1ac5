package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Write replaces path with data, readable as perm: a temporary file in the
// same directory is written, fsynced and renamed over path, and the
// directory is fsynced so the rename itself survives a crash.
func Write(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, true)
}

// WriteVolatile replaces path with data as Write does, without the
// fsyncs: a reader sees the old or the new content, also after the
// process dies, but a kernel crash or power loss may leave either, or an
// empty file. For state that describes the running kernel and dies with
// it (what is in force in nftables), where two fsyncs per write cost
// more than the write.
func WriteVolatile(path string, data []byte, perm os.FileMode) error {
	return write(path, data, perm, false)
}

func write(path string, data []byte, perm os.FileMode, sync bool) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, tempPrefix(path))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(f.Name()) // no-op after the rename
	err = f.Chmod(perm)       // CreateTemp makes 0600 files
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if !sync {
		return nil
	}
	return SyncDir(dir)
}

func tempPrefix(path string) string { return ".tmp-" + filepath.Base(path) + "-" }

// RemoveTemps deletes the temporary files of path that a writer killed
// between its create and its rename left beside it. Only path's one
// writer calls it, before it writes: another writer's file in flight would
// go too.
func RemoveTemps(path string) error {
	dir := filepath.Dir(path)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tempPrefix(path)) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// SyncDir fsyncs a directory, making renames and removals in it durable. A
// directory that does not exist has nothing to make durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
