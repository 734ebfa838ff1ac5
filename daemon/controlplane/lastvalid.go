package controlplane

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/coordino/coordino/daemon/atomicfile"
)

// lastValid keeps, per policy file name, the last content of that file that
// parsed, in a directory of the daemon's state dir. A file that is broken
// when the daemon starts then keeps the protection it had: without this
// copy the daemon would know no valid version of it and drop its policies.
type lastValid struct{ dir string }

func (l lastValid) path(name string) string { return filepath.Join(l.dir, name) }

// load returns the saved content of name, or nil if there is none.
func (l lastValid) load(name string) ([]byte, error) {
	data, err := os.ReadFile(l.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return data, err
}

// save replaces the copy of name: temp file, fsync, rename, fsync of the
// directory, so a crash leaves the old copy or the new one.
func (l lastValid) save(name string, data []byte) error {
	if old, err := os.ReadFile(l.path(name)); err == nil && string(old) == string(data) {
		return nil
	}
	if err := os.MkdirAll(l.dir, 0o700); err != nil {
		return err
	}
	return atomicfile.Write(l.path(name), data, 0o600)
}

// remove drops the copy of a file that was deleted from the policy dir.
func (l lastValid) remove(name string) error {
	if err := os.Remove(l.path(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return atomicfile.SyncDir(l.dir)
}

// names lists the saved copies.
func (l lastValid) names() ([]string, error) {
	entries, err := os.ReadDir(l.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.Type().IsRegular() && isPolicyFile(e.Name()) && e.Name()[0] != '.' {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
