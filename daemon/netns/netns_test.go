package netns

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/test/privileged"
)

// newNS creates a throwaway network namespace and removes it at test end
// (unless the test already did).
func newNS(t *testing.T) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		n.Close()
		if _, err := os.Stat(n.Path()); err == nil {
			_ = testutils.UnmountNS(n)
		}
	})
	return n
}

// pinPath returns a fresh pin path whose mount is removed at test end.
func pinPath(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "netns", name)
	t.Cleanup(func() {
		if err := Unpin(p); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return p
}

func mountCount(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatalf("read mountinfo: %v", err)
	}
	n := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			n++
		}
	}
	return n
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return st.Ino
}

func TestVerifyRejects(t *testing.T) {
	dir := t.TempDir()
	regular := filepath.Join(dir, "regular")
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path string
		want       error
		msg        string
	}{
		{"missing", filepath.Join(dir, "missing"), ErrNotFound, "not found"},
		{"regular file", regular, ErrNotNsfs, "a regular file"},
		{"directory", dir, ErrNotNsfs, "a directory"},
		{"mount namespace", "/proc/self/ns/mnt", ErrNotNetNS, "a mount namespace"},
	}
	seen := map[string]string{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Verify(c.path)
			if !errors.Is(err, c.want) {
				t.Fatalf("Verify(%s) = %v, want %v", c.path, err, c.want)
			}
			if !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), c.path) {
				t.Fatalf("Verify(%s) = %q, want it to mention %q and the path", c.path, err, c.msg)
			}
			if other, dup := seen[err.Error()]; dup {
				t.Fatalf("same message for %s and %s: %q", c.name, other, err)
			}
			seen[err.Error()] = c.name
		})
	}
}

func TestVerifyAccepts(t *testing.T) {
	if err := Verify("/proc/self/ns/net"); err != nil {
		t.Fatalf("Verify(/proc/self/ns/net) = %v", err)
	}
}

func TestPinSurvivesOriginal(t *testing.T) {
	privileged.Require(t)
	orig := newNS(t)
	const dummy = "pinprobe0"
	if err := orig.Do(func(ns.NetNS) error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: dummy}, PeerName: dummy + "p"})
	}); err != nil {
		t.Fatalf("add veth in %s: %v", orig.Path(), err)
	}
	pin := pinPath(t, "pod-a")
	if err := Pin(orig.Path(), pin); err != nil {
		t.Fatalf("Pin: %v", err)
	}
	if err := Verify(pin); err != nil {
		t.Fatalf("Verify(pin): %v", err)
	}
	if fi, err := os.Stat(filepath.Dir(pin)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("pin dir mode = %v, %v; want 0700", fi.Mode().Perm(), err)
	}
	wantIno := inode(t, orig.Path())
	if got := inode(t, pin); got != wantIno {
		t.Fatalf("pin inode %d, want %d", got, wantIno)
	}

	// Drop every other reference: the runtime's mount and our open fd.
	if err := orig.Close(); err != nil {
		t.Fatal(err)
	}
	if err := testutils.UnmountNS(orig); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orig.Path()); !os.IsNotExist(err) {
		t.Fatalf("original netns file still there: %v", err)
	}

	pinned, err := ns.GetNS(pin)
	if err != nil {
		t.Fatalf("open pin: %v", err)
	}
	defer pinned.Close()
	if err := pinned.Do(func(ns.NetNS) error {
		_, err := netlink.LinkByName(dummy)
		return err
	}); err != nil {
		t.Fatalf("pinned netns lost its link %s: %v", dummy, err)
	}
}

func TestPinIdempotentAndConflict(t *testing.T) {
	privileged.Require(t)
	a, b := newNS(t), newNS(t)
	pin := pinPath(t, "pod-b")
	for i := range 2 {
		if err := Pin(a.Path(), pin); err != nil {
			t.Fatalf("Pin #%d: %v", i+1, err)
		}
	}
	if n := mountCount(t, pin); n != 1 {
		t.Fatalf("%d mounts on %s after pinning twice, want 1", n, pin)
	}
	err := Pin(b.Path(), pin)
	if err == nil || !strings.Contains(err.Error(), "different namespace") {
		t.Fatalf("Pin of another namespace onto %s = %v, want 'different namespace' error", pin, err)
	}
	if got, want := inode(t, pin), inode(t, a.Path()); got != want {
		t.Fatalf("conflicting Pin changed the pin: inode %d, want %d", got, want)
	}
}

func TestPinRejectsNonNetNS(t *testing.T) {
	privileged.Require(t)
	pin := pinPath(t, "pod-c")
	if err := Pin("/proc/self/ns/mnt", pin); !errors.Is(err, ErrNotNetNS) {
		t.Fatalf("Pin(mnt ns) = %v, want ErrNotNetNS", err)
	}
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Fatalf("failed Pin left %s behind: %v", pin, err)
	}
}

func TestPinOverLeftoverFile(t *testing.T) {
	privileged.Require(t)
	a := newNS(t)
	pin := pinPath(t, "pod-d")
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pin, nil, 0o600); err != nil { // as left by a crash before mount
		t.Fatal(err)
	}
	if err := Pin(a.Path(), pin); err != nil {
		t.Fatalf("Pin over empty leftover: %v", err)
	}
	if err := Verify(pin); err != nil {
		t.Fatal(err)
	}
}

func TestUnpin(t *testing.T) {
	privileged.Require(t)
	a := newNS(t)
	pin := pinPath(t, "pod-e")
	if err := Pin(a.Path(), pin); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := Unpin(pin); err != nil {
			t.Fatalf("Unpin #%d: %v", i+1, err)
		}
		if _, err := os.Stat(pin); !os.IsNotExist(err) {
			t.Fatalf("after Unpin #%d %s still exists: %v", i+1, pin, err)
		}
		if n := mountCount(t, pin); n != 0 {
			t.Fatalf("after Unpin #%d %d mounts remain on %s", i+1, n, pin)
		}
	}
	// An unmounted leftover file is removed without complaint.
	if err := os.WriteFile(pin, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Unpin(pin); err != nil {
		t.Fatalf("Unpin of an unmounted file: %v", err)
	}
	if _, err := os.Stat(pin); !os.IsNotExist(err) {
		t.Fatalf("unmounted leftover not removed: %v", err)
	}
}

func TestListPins(t *testing.T) {
	privileged.Require(t)
	a := newNS(t)
	p1 := pinPath(t, "x1")
	p2 := filepath.Join(filepath.Dir(p1), "x2")
	t.Cleanup(func() { _ = Unpin(p2) })
	for _, p := range []string{p1, p2} {
		if err := Pin(a.Path(), p); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(filepath.Dir(p1), "subdir"), 0o700); err != nil {
		t.Fatal(err)
	}
	got, err := ListPins(filepath.Dir(p1))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != p1 || got[1] != p2 {
		t.Fatalf("ListPins = %v, want [%s %s]", got, p1, p2)
	}
	if got, err := ListPins(filepath.Join(t.TempDir(), "absent")); err != nil || got != nil {
		t.Fatalf("ListPins(absent) = %v, %v; want nil, nil", got, err)
	}
}
