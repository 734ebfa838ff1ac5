package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"
)

// nsGetNSType is NS_GET_NSTYPE, _IO(0xb7, 0x3) from <linux/nsfs.h>; x/sys/unix
// does not export it.
const nsGetNSType = 0xb703

// ErrNotFound is wrapped by Verify's error when the path does not exist.
var ErrNotFound = errors.New("not found")

// ErrNotNsfs is wrapped by Verify's error when the path is not a namespace file.
var ErrNotNsfs = errors.New("not an nsfs file")

// ErrNotNetNS is wrapped by Verify's error when the path is a namespace of
// another type (mount, pid, ...).
var ErrNotNetNS = errors.New("a namespace but not a network namespace")

// Verify returns nil if path is a network namespace file (on nsfs, type
// CLONE_NEWNET); otherwise an error naming path and wrapping ErrNotFound,
// ErrNotNsfs or ErrNotNetNS.
func Verify(path string) error {
	var sfs unix.Statfs_t
	if err := unix.Statfs(path, &sfs); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("network namespace %q: %w", path, ErrNotFound)
		}
		return fmt.Errorf("network namespace %q: statfs: %w", path, err)
	}
	if uint32(sfs.Type) != unix.NSFS_MAGIC {
		return fmt.Errorf("network namespace %q: %w (it is %s)", path, ErrNotNsfs, describe(path, sfs.Type))
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("network namespace %q: open: %w", path, err)
	}
	defer unix.Close(fd)
	typ, err := unix.IoctlRetInt(fd, nsGetNSType)
	if err != nil {
		return fmt.Errorf("network namespace %q: ioctl NS_GET_NSTYPE: %w", path, err)
	}
	if typ != unix.CLONE_NEWNET {
		return fmt.Errorf("network namespace %q: %w (it is a %s namespace)", path, ErrNotNetNS, nsTypeName(typ))
	}
	return nil
}

// ownNetNS is the network namespace of this process (its main thread: the
// daemon never leaves it except on briefly locked threads).
const ownNetNS = "/proc/self/ns/net"

// ErrOwnNetNS is returned by RefuseOwn when path is this process's own
// network namespace: a pod configured there would take over the node's
// interfaces and routes.
var ErrOwnNetNS = errors.New("the daemon's own network namespace (the node's)")

// RefuseOwn returns an error wrapping ErrOwnNetNS if path names the network
// namespace this process runs in.
func RefuseOwn(path string) error {
	var own, st unix.Stat_t
	if err := unix.Stat(ownNetNS, &own); err != nil {
		return fmt.Errorf("stat %s: %w", ownNetNS, err)
	}
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("network namespace %q: stat: %w", path, err)
	}
	if st.Dev == own.Dev && st.Ino == own.Ino {
		return fmt.Errorf("network namespace %q is %w", path, ErrOwnNetNS)
	}
	return nil
}

// describe says what a non-nsfs path is, so the error tells a directory from a
// regular file.
func describe(path string, fsType int64) string {
	kind := "a file"
	if fi, err := os.Stat(path); err == nil {
		switch m := fi.Mode(); {
		case m.IsDir():
			kind = "a directory"
		case m.IsRegular():
			kind = "a regular file"
		case m&fs.ModeDevice != 0:
			kind = "a device"
		case m&fs.ModeNamedPipe != 0:
			kind = "a named pipe"
		case m&fs.ModeSocket != 0:
			kind = "a socket"
		}
	}
	return fmt.Sprintf("%s on filesystem type %#x", kind, fsType)
}

func nsTypeName(t int) string {
	switch t {
	case unix.CLONE_NEWNS:
		return "mount"
	case unix.CLONE_NEWUTS:
		return "uts"
	case unix.CLONE_NEWIPC:
		return "ipc"
	case unix.CLONE_NEWUSER:
		return "user"
	case unix.CLONE_NEWPID:
		return "pid"
	case unix.CLONE_NEWCGROUP:
		return "cgroup"
	case unix.CLONE_NEWTIME:
		return "time"
	}
	return fmt.Sprintf("type %#x", t)
}

// Pin bind-mounts the network namespace at nsPath onto pinPath (creating an
// empty file and a 0700 parent directory as needed) so the namespace outlives
// the runtime's handle. It returns nil if pinPath already pins the same
// namespace and an error if it pins a different one.
func Pin(nsPath, pinPath string) error {
	if err := Verify(nsPath); err != nil {
		return fmt.Errorf("pin %q: %w", pinPath, err)
	}
	var want unix.Stat_t
	if err := unix.Stat(nsPath, &want); err != nil {
		return fmt.Errorf("pin %q: stat %q: %w", pinPath, nsPath, err)
	}

	pinned, err := pinnedNS(pinPath)
	if err != nil {
		return fmt.Errorf("pin %q: %w", pinPath, err)
	}
	if pinned != nil {
		if pinned.Dev == want.Dev && pinned.Ino == want.Ino {
			return nil
		}
		return fmt.Errorf("pin %q: already pins a different namespace (inode %d, want %d from %q)",
			pinPath, pinned.Ino, want.Ino, nsPath)
	}

	if err := os.MkdirAll(filepath.Dir(pinPath), 0o700); err != nil {
		return fmt.Errorf("pin %q: create directory: %w", pinPath, err)
	}
	f, err := os.OpenFile(pinPath, os.O_RDONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("pin %q: create mount point: %w", pinPath, err)
	}
	f.Close()
	if err := unix.Mount(nsPath, pinPath, "", unix.MS_BIND, ""); err != nil {
		// The mount point is ours and empty; leaving it would only confuse GC.
		_ = os.Remove(pinPath)
		return fmt.Errorf("pin %q: bind mount %q: %w", pinPath, nsPath, err)
	}
	return nil
}

// pinnedNS returns the stat of the namespace mounted at pinPath, or nil if
// pinPath is absent or not a namespace (e.g. an empty file left by a crash).
func pinnedNS(pinPath string) (*unix.Stat_t, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(pinPath, &sfs); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("statfs: %w", err)
	}
	if uint32(sfs.Type) != unix.NSFS_MAGIC {
		return nil, nil
	}
	var st unix.Stat_t
	if err := unix.Stat(pinPath, &st); err != nil {
		return nil, fmt.Errorf("stat: %w", err)
	}
	return &st, nil
}

// maxStackedMounts bounds Detach's unmount loop; a path carries one mount,
// more only if something else mounted over it.
const maxStackedMounts = 16

// Detach lazily unmounts every mount stacked on path. It returns nil if path
// does not exist or is not (any more) a mount point.
func Detach(path string) error {
	for range maxStackedMounts {
		err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err == nil {
			continue
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil // not (or no longer) a mount point, or already gone
		}
		return fmt.Errorf("unmount %q: %w", path, err)
	}
	return fmt.Errorf("unmount %q: still mounted after %d unmounts", path, maxStackedMounts)
}

// Unpin detaches every mount on pinPath and removes the file. It returns nil
// if pinPath does not exist or is not mounted.
func Unpin(pinPath string) error {
	if err := Detach(pinPath); err != nil {
		return fmt.Errorf("unpin: %w", err)
	}
	if err := os.Remove(pinPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("unpin %q: remove: %w", pinPath, err)
	}
	return nil
}

// ListPins returns the sorted paths of the pin files (every non-directory
// entry) in dir, pinned or not, so GC can also remove empty leftovers. A
// missing dir yields no pins and no error.
func ListPins(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("list pins in %q: %w", dir, err)
	}
	var pins []string
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		pins = append(pins, filepath.Join(dir, e.Name()))
	}
	sort.Strings(pins)
	return pins, nil
}
