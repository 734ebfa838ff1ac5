package netns

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzVerify feeds Verify untrusted-looking paths (CNI_NETNS comes from the
// runtime) inside a sandbox holding one of each kind of file; Verify must
// never panic and must accept only network namespaces.
func FuzzVerify(f *testing.F) {
	for _, s := range []string{"netlink", "mntlink", "regular", "dir", "dir/", "missing", "", "\x00", "a\x00b", "dir/../regular", strings.Repeat("x/", 300)} {
		f.Add(s)
	}
	dir := f.TempDir()
	must := func(err error) {
		if err != nil {
			f.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "regular"), nil, 0o600))
	must(os.Mkdir(filepath.Join(dir, "dir"), 0o700))
	must(os.Symlink("/proc/self/ns/net", filepath.Join(dir, "netlink")))
	must(os.Symlink("/proc/self/ns/mnt", filepath.Join(dir, "mntlink")))

	f.Fuzz(func(t *testing.T, rel string) {
		path := filepath.Join(dir, rel)
		if path != dir && !strings.HasPrefix(path, dir+"/") {
			t.Skip("outside the sandbox")
		}
		err := Verify(path)
		if err == nil {
			var st unix.Statfs_t
			if unix.Statfs(path, &st) != nil || uint32(st.Type) != unix.NSFS_MAGIC {
				t.Fatalf("Verify(%q) accepted a non-nsfs path", path)
			}
			return
		}
		if !strings.Contains(err.Error(), "network namespace") {
			t.Fatalf("Verify(%q) error %q does not say what it checked", path, err)
		}
	})
}
