package datapath

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// checkBPFFS creates dir and verifies it is on a BPF filesystem, where pins
// outlive the daemon.
func checkBPFFS(dir string) error {
	if dir == "" {
		return errors.New("datapath: BPFDir is empty")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("datapath: create BPF dir %q: %w", dir, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("datapath: statfs %q: %w", dir, err)
	}
	if uint32(st.Type) != unix.BPF_FS_MAGIC {
		return fmt.Errorf("datapath: BPF dir %q is not on a bpf filesystem (mount -t bpf bpf /sys/fs/bpf)", dir)
	}
	return nil
}

// MountBPFFS mounts a BPF filesystem at dir unless one is already there;
// the daemon calls it for /sys/fs/bpf on hosts that do not mount it.
func MountBPFFS(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %q: %w", dir, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && uint32(st.Type) == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs on %q: %w", dir, err)
	}
	return nil
}
