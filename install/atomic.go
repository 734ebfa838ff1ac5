package install

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// tempPrefix names the installer's temporary files. They start with a dot
// and have no .conf/.conflist/.json extension, so no runtime ever loads one.
const tempPrefix = ".coordino-tmp-"

// faultHook is called after each step of writeAtomic; tests use it to stop
// the process mid-write.
var faultHook = func(step string) {}

// writeAtomic replaces path with the content of src: it writes a temporary
// file in the same directory, fsyncs it, renames it over path and fsyncs the
// directory, so after a crash path holds either its old or its new content.
func writeAtomic(path string, src io.Reader, perm fs.FileMode) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, tempPrefix+base+"-")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	faultHook("created")
	if _, err := io.Copy(tmp, src); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	faultHook("written")
	if err := tmp.Chmod(perm); err != nil { // CreateTemp makes 0600 files
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("write %s: fsync: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	faultHook("synced")
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	faultHook("renamed")
	// The rename is durable only once the directory entry is on disk.
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// removeDurably removes path (absent is fine) and fsyncs its directory.
func removeDurably(path string) (removed bool, err error) {
	if err := os.Remove(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("remove %s: %w", path, err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return true, fmt.Errorf("remove %s: %w", path, err)
	}
	return true, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// fileHasContent reports whether path exists and holds exactly data with
// permission bits perm.
func fileHasContent(path string, data []byte, perm fs.FileMode) (bool, error) {
	cur, mode, err := readWithMode(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return mode == perm && bytes.Equal(cur, data), nil
}

// readWithMode reads path and returns its content and permission bits, both
// from one open file.
func readWithMode(path string) ([]byte, fs.FileMode, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", path, err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", path, err)
	}
	return data, fi.Mode().Perm(), nil
}

// sameFiles reports whether dst exists and has the same bytes and mode as src,
// reading both in chunks so that large binaries are never held in memory.
func sameFiles(src, dst string) (bool, error) {
	df, err := os.Open(dst)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open %s: %w", dst, err)
	}
	defer df.Close()
	sf, err := os.Open(src)
	if err != nil {
		return false, fmt.Errorf("open %s: %w", src, err)
	}
	defer sf.Close()
	si, err := sf.Stat()
	if err != nil {
		return false, err
	}
	di, err := df.Stat()
	if err != nil {
		return false, err
	}
	if si.Size() != di.Size() || di.Mode().Perm() != 0o755 {
		return false, nil
	}
	a, b := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		n, errA := io.ReadFull(sf, a)
		m, errB := io.ReadFull(df, b[:n])
		if m != n || !bytes.Equal(a[:n], b[:n]) {
			return false, nil
		}
		if errA == io.EOF || errA == io.ErrUnexpectedEOF {
			return true, nil
		}
		if errA != nil {
			return false, fmt.Errorf("read %s: %w", src, errA)
		}
		if errB != nil {
			return false, fmt.Errorf("read %s: %w", dst, errB)
		}
	}
}

// removeTemps deletes temporary files left in dir by a killed installer.
func removeTemps(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) && e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove stale %s: %w", filepath.Join(dir, e.Name()), err)
			}
		}
	}
	return nil
}
