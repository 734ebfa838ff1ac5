package install

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/coordino/coordino/conflist"
	"github.com/coordino/coordino/test/privileged"
)

// portMapNode is a node plus a portmap binary in the image.
func portMapNode(t *testing.T) (*node, string) {
	t.Helper()
	n := newNode(t)
	src := filepath.Join(filepath.Dir(n.src), "portmap")
	if err := os.WriteFile(src, []byte("portmap v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	return n, src
}

func (n *node) portMapInstaller(t *testing.T, mode Mode, portMap bool, src string) *Installer {
	t.Helper()
	in, err := New(Config{BinDir: n.bin, ConfDir: n.conf, PluginSource: n.src, PortMapSource: src, Mode: mode, Conflist: conflist.Options{PortMap: portMap}})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func readOrEmpty(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// TestPortMapCopiedWithPrimaryConflist: a primary conflist chaining portmap
// brings portmap into the bin dir (executable); uninstall takes it away again.
func TestPortMapCopiedWithPrimaryConflist(t *testing.T) {
	n, src := portMapNode(t)
	in := n.portMapInstaller(t, ModePrimary, true, src)
	if err := in.Install(); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(n.bin, "portmap")
	if got := readOrEmpty(t, dst); got != "portmap v2" {
		t.Fatalf("bin dir portmap = %q, want the image's", got)
	}
	if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o755 {
		t.Errorf("portmap mode %v, want 0755", fi.Mode())
	}
	conf := readOrEmpty(t, in.ConfPath())
	if !bytes.Contains([]byte(conf), []byte(`"portmap"`)) {
		t.Errorf("conflist does not chain portmap:\n%s", conf)
	}
	writes := in.Writes()
	if err := in.Install(); err != nil {
		t.Fatal(err)
	}
	if in.Writes() != writes {
		t.Errorf("re-install wrote %d files, want none", in.Writes()-writes)
	}
	if err := in.Uninstall(); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(n.bin)
	if len(entries) != 0 {
		t.Errorf("bin dir after uninstall holds %v, want nothing", entries)
	}
}

// TestPortMapNotCopiedUnlessUsed: with portmap off, or in chained mode (the
// primary CNI brings its own chain), the bin dir gets no portmap.
func TestPortMapNotCopiedUnlessUsed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    Mode
		portMap bool
	}{{"primary without portmap", ModePrimary, false}, {"chained", ModeChained, true}} {
		t.Run(tc.name, func(t *testing.T) {
			n, src := portMapNode(t)
			if tc.mode == ModeChained {
				n.addPrimary(t, "10-flannel.conflist")
			}
			if err := n.portMapInstaller(t, tc.mode, tc.portMap, src).Install(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(n.bin, "portmap")); !os.IsNotExist(err) {
				t.Errorf("portmap in bin dir (stat err %v), want none", err)
			}
		})
	}
}

// TestPortMapKeepsHostsAndUpdatesOurs: a portmap the host already has is
// never replaced nor removed; one the installer put there is updated to the
// image's and removed on uninstall.
func TestPortMapKeepsHostsAndUpdatesOurs(t *testing.T) {
	t.Run("host's", func(t *testing.T) {
		n, src := portMapNode(t)
		dst := filepath.Join(n.bin, "portmap")
		if err := os.WriteFile(dst, []byte("host portmap v3"), 0o755); err != nil {
			t.Fatal(err)
		}
		in := n.portMapInstaller(t, ModePrimary, true, src)
		if err := in.Install(); err != nil {
			t.Fatal(err)
		}
		if got := readOrEmpty(t, dst); got != "host portmap v3" {
			t.Fatalf("host's portmap replaced by %q", got)
		}
		if err := in.Uninstall(); err != nil {
			t.Fatal(err)
		}
		if got := readOrEmpty(t, dst); got != "host portmap v3" {
			t.Fatalf("host's portmap after uninstall = %q, want it kept", got)
		}
	})
	t.Run("ours", func(t *testing.T) {
		n, src := portMapNode(t)
		old := filepath.Join(filepath.Dir(src), "portmap-old")
		if err := os.WriteFile(old, []byte("portmap v1"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := n.portMapInstaller(t, ModePrimary, true, old).Install(); err != nil {
			t.Fatal(err)
		}
		in := n.portMapInstaller(t, ModePrimary, true, src)
		if err := in.Install(); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(n.bin, "portmap")
		if got := readOrEmpty(t, dst); got != "portmap v2" {
			t.Fatalf("our old portmap not updated: %q", got)
		}
		if err := in.Uninstall(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dst); !os.IsNotExist(err) {
			t.Errorf("our portmap left after uninstall (stat err %v)", err)
		}
	})
}

// TestHostPortMapMustAcceptCNIVersion: a host portmap that refuses the
// conflist's cniVersion would fail every pod, so Install refuses with an
// error naming it; one that accepts it is kept. Debian's portmap (plugins
// v1.1, up to cniVersion 1.0.0) plays the host's.
func TestHostPortMapMustAcceptCNIVersion(t *testing.T) {
	debian, err := os.ReadFile("/usr/lib/cni/portmap")
	if err != nil {
		privileged.Needs(t, "Debian's containernetworking-plugins not installed (hack/deps.sh installs it): %v", err)
	}
	for _, tc := range []struct {
		cniVersion string
		wantErr    string
	}{
		{"1.1.0", "supports cniVersion [0.1.0 0.2.0 0.3.0 0.3.1 0.4.0 1.0.0], not 1.1.0"},
		{"1.0.0", ""},
	} {
		t.Run(tc.cniVersion, func(t *testing.T) {
			n, src := portMapNode(t)
			dst := filepath.Join(n.bin, "portmap")
			if err := os.WriteFile(dst, debian, 0o755); err != nil {
				t.Fatal(err)
			}
			in, err := New(Config{BinDir: n.bin, ConfDir: n.conf, PluginSource: n.src, PortMapSource: src, Mode: ModePrimary,
				Conflist: conflist.Options{CNIVersion: tc.cniVersion, PortMap: true}})
			if err != nil {
				t.Fatal(err)
			}
			err = in.Install()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Install() = %v, want error %q", err, tc.wantErr)
			}
			if got, _ := os.ReadFile(dst); !bytes.Equal(got, debian) {
				t.Errorf("host's portmap replaced")
			}
			if _, err := os.Stat(in.ConfPath()); tc.wantErr != "" && !os.IsNotExist(err) {
				t.Errorf("conflist written (stat err %v) though portmap would refuse it", err)
			}
		})
	}
}

// TestPortMapKilledBetweenRecordAndBinary: a kill after the record names the
// image's portmap but before the binary lands (or while our older one is
// still there) leaves a node the next install completes and uninstall
// cleans: the record is written first.
func TestPortMapKilledBetweenRecordAndBinary(t *testing.T) {
	for _, old := range []string{"", "portmap v1"} {
		t.Run("old="+old, func(t *testing.T) {
			n, src := portMapNode(t)
			v2, err := fileSHA256(src)
			if err != nil {
				t.Fatal(err)
			}
			record := v2 + "\n"
			dst := filepath.Join(n.bin, "portmap")
			if old != "" {
				if err := os.WriteFile(dst, []byte(old), 0o755); err != nil {
					t.Fatal(err)
				}
				v1, _ := fileSHA256(dst)
				record = v1 + "\n" + record
			}
			if err := os.WriteFile(filepath.Join(n.bin, portMapRecord), []byte(record), 0o644); err != nil {
				t.Fatal(err)
			}
			in := n.portMapInstaller(t, ModePrimary, true, src)
			if err := in.Install(); err != nil {
				t.Fatal(err)
			}
			if got := readOrEmpty(t, dst); got != "portmap v2" {
				t.Fatalf("bin dir portmap after re-install = %q, want the image's", got)
			}
			if err := in.Uninstall(); err != nil {
				t.Fatal(err)
			}
			if entries, _ := os.ReadDir(n.bin); len(entries) != 0 {
				t.Errorf("bin dir after uninstall holds %v, want nothing", entries)
			}
		})
	}
}
