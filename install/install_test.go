package install

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/coordino/coordino/conflist"
)

const fixtureDir = "../conflist/testdata"

// shape is one primary CNI's config as found on real nodes.
type shape struct {
	file  string
	types []string
}

var shapes = []shape{
	{"10-calico.conflist", []string{"calico", "bandwidth", "portmap"}},
	{"10-flannel.conflist", []string{"flannel", "portmap"}},
	{"10-aws.conflist", []string{"aws-cni", "egress-cni", "portmap"}},
	{"05-cilium.conflist", []string{"cilium-cni"}},
	{"10-bridge.conf", []string{"bridge"}},
	{"20-bridge-versions.conflist", []string{"bridge", "portmap", "tuning"}},
	{"30-ptp.json", []string{"ptp"}},
	{"40-list.json", []string{"ptp", "firewall"}},
}

// node is a fake host: a CNI bin dir, a CNI conf dir and a plugin binary to install.
type node struct {
	bin, conf, src string
	srcData        []byte
}

func newNode(t testing.TB) *node {
	t.Helper()
	root := t.TempDir()
	n := &node{bin: filepath.Join(root, "opt/cni/bin"), conf: filepath.Join(root, "etc/cni/net.d"), src: filepath.Join(root, "image/coordino")}
	for _, d := range []string{n.bin, n.conf, filepath.Dir(n.src)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n.srcData = make([]byte, 300<<10)
	rand.Read(n.srcData)
	if err := os.WriteFile(n.src, n.srcData, 0o755); err != nil {
		t.Fatal(err)
	}
	return n
}

// addPrimary copies a fixture into the conf dir and returns its bytes.
func (n *node) addPrimary(t testing.TB, file string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(fixtureDir, file))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.conf, file), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return data
}

func (n *node) installer(t testing.TB, mode Mode, knobs conflist.Knobs) *Installer {
	t.Helper()
	in, err := New(Config{BinDir: n.bin, ConfDir: n.conf, PluginSource: n.src, Mode: mode, Conflist: conflist.Options{Knobs: knobs}})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// snapshot maps each file name in dir to its content; dot-files (the lock)
// are listed separately so tests can say what they expect of them.
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = string(data)
	}
	return m
}

type fileID struct {
	ino   uint64
	mtime int64
	data  string
}

func identify(t testing.TB, path string) fileID {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	return fileID{st.Ino, st.Mtim.Nano(), string(data)}
}

// runtimeView loads the conf dir the way CRI-O/ocicni does (first valid
// config in lexical order, parsed by libcni) and returns what it would use.
func runtimeView(t testing.TB, dir string) (string, *libcni.NetworkConfigList) {
	t.Helper()
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var list *libcni.NetworkConfigList
		var m map[string]any
		_ = json.Unmarshal(data, &m)
		if _, isList := m["plugins"]; strings.HasSuffix(f, ".conflist") || strings.HasSuffix(f, ".json") && isList {
			list, err = libcni.ConfListFromBytes(data)
		} else {
			var conf *libcni.NetworkConfig
			if conf, err = libcni.ConfFromBytes(data); err == nil {
				list, err = libcni.ConfListFromConf(conf)
			}
		}
		if err == nil && len(list.Plugins) > 0 {
			return filepath.Base(f), list
		}
	}
	return "", nil
}

func types(list *libcni.NetworkConfigList) []string {
	var ts []string
	for _, p := range list.Plugins {
		ts = append(ts, p.Network.Type)
	}
	return ts
}

func TestInstallPrimary(t *testing.T) {
	for _, sh := range append([]shape{{}}, shapes...) { // alone, and next to each other CNI
		name := sh.file
		if name == "" {
			name = "empty-dir"
		}
		t.Run(name, func(t *testing.T) {
			n := newNode(t)
			var before map[string]string
			if sh.file != "" {
				n.addPrimary(t, sh.file)
			}
			before = snapshot(t, n.conf)
			in := n.installer(t, ModePrimary, conflist.Knobs{MTU: 1450})
			if err := in.Install(); err != nil {
				t.Fatal(err)
			}
			if got := in.Writes(); got != 2 {
				t.Fatalf("first install wrote %d files, want 2 (plugin, conflist)", got)
			}
			bin, err := os.ReadFile(filepath.Join(n.bin, "coordino"))
			if err != nil || !bytes.Equal(bin, n.srcData) {
				t.Fatalf("plugin not copied: %v", err)
			}
			if st, _ := os.Stat(filepath.Join(n.bin, "coordino")); st.Mode().Perm() != 0o755 {
				t.Fatalf("plugin mode %v", st.Mode())
			}
			want, _ := conflist.Build(conflist.Options{Knobs: conflist.Knobs{MTU: 1450}})
			got, err := os.ReadFile(filepath.Join(n.conf, "10-coordino.conflist"))
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("conflist = %s, %v", got, err)
			}
			// Other CNIs' files are never touched.
			for name, data := range before {
				if snapshot(t, n.conf)[name] != data {
					t.Fatalf("%s changed", name)
				}
			}
			if sh.file == "" || sh.file > "10-coordino.conflist" {
				if f, list := runtimeView(t, n.conf); f != "10-coordino.conflist" || !slices.Equal(types(list), []string{"coordino"}) {
					t.Fatalf("runtime would use %s", f)
				}
			}

			// Re-install: nothing rewritten.
			idConf, idBin := identify(t, in.ConfPath()), identify(t, filepath.Join(n.bin, "coordino"))
			in2 := n.installer(t, ModePrimary, conflist.Knobs{MTU: 1450})
			if err := in2.Install(); err != nil {
				t.Fatal(err)
			}
			if in2.Writes() != 0 || identify(t, in.ConfPath()) != idConf || identify(t, filepath.Join(n.bin, "coordino")) != idBin {
				t.Fatalf("re-install rewrote files (writes=%d)", in2.Writes())
			}

			// A knob change rewrites only the conflist.
			in3 := n.installer(t, ModePrimary, conflist.Knobs{MTU: 1400})
			if err := in3.Install(); err != nil {
				t.Fatal(err)
			}
			if in3.Writes() != 1 || identify(t, filepath.Join(n.bin, "coordino")) != idBin {
				t.Fatalf("knob change wrote %d files, want 1", in3.Writes())
			}

			if err := in3.Uninstall(); err != nil {
				t.Fatal(err)
			}
			if after := snapshot(t, n.conf); !mapsEqual(after, before) {
				t.Fatalf("after uninstall conf dir = %v, want %v", keys(after), keys(before))
			}
			if after := snapshot(t, n.bin); len(after) != 0 {
				t.Fatalf("after uninstall bin dir has %v", keys(after))
			}
		})
	}
}

func TestInstallChained(t *testing.T) {
	for _, sh := range shapes {
		t.Run(sh.file, func(t *testing.T) {
			n := newNode(t)
			primary := n.addPrimary(t, sh.file)
			before := snapshot(t, n.conf)
			in := n.installer(t, ModeChained, conflist.Knobs{LogLevel: "debug"})
			if err := in.Install(); err != nil {
				t.Fatal(err)
			}
			if got := filepath.Base(in.ConfPath()); got != "00-coordino-chained.conflist" {
				t.Fatalf("ConfPath = %s", got)
			}
			// The runtime now uses our file: the primary's chain, then coordino,
			// under the primary's network name.
			f, list := runtimeView(t, n.conf)
			if f != "00-coordino-chained.conflist" {
				t.Fatalf("runtime would use %s", f)
			}
			if want := append(slices.Clone(sh.types), "coordino"); !slices.Equal(types(list), want) {
				t.Fatalf("runtime chain %v, want %v", types(list), want)
			}
			pc, _ := conflist.Parse(primary, sh.file)
			if list.Name != pc.Name() {
				t.Fatalf("network name %q, want the primary's %q", list.Name, pc.Name())
			}
			if got, _ := os.ReadFile(filepath.Join(n.conf, sh.file)); !bytes.Equal(got, primary) {
				t.Fatal("primary config was modified")
			}

			// Re-install changes nothing.
			id := identify(t, in.ConfPath())
			in2 := n.installer(t, ModeChained, conflist.Knobs{LogLevel: "debug"})
			if err := in2.Install(); err != nil {
				t.Fatal(err)
			}
			if in2.Writes() != 0 || identify(t, in.ConfPath()) != id {
				t.Fatalf("re-install rewrote files (writes=%d)", in2.Writes())
			}

			// Uninstall leaves the conf dir byte-for-byte as before install.
			if err := in2.Uninstall(); err != nil {
				t.Fatal(err)
			}
			if after := snapshot(t, n.conf); !mapsEqual(after, before) {
				t.Fatalf("after uninstall conf dir = %v, want %v", keys(after), keys(before))
			}
			if _, err := os.Stat(filepath.Join(n.bin, "coordino")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("plugin still installed: %v", err)
			}
			// Uninstalling twice is fine.
			if err := in2.Uninstall(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestChainedWithoutPrimary(t *testing.T) {
	n := newNode(t)
	in := n.installer(t, ModeChained, conflist.Knobs{})
	if err := in.Install(); !errors.Is(err, ErrNoPrimary) {
		t.Fatalf("err = %v, want ErrNoPrimary", err)
	}
	// A chain left behind by a primary that has since gone is removed.
	n.addPrimary(t, "10-flannel.conflist")
	if err := in.Install(); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(n.conf, "10-flannel.conflist"))
	if err := in.Install(); !errors.Is(err, ErrNoPrimary) {
		t.Fatalf("err = %v, want ErrNoPrimary", err)
	}
	if _, err := os.Stat(in.ConfPath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale chain kept: %v", err)
	}
}

func TestChainedSkipsInvalidAndOwnFiles(t *testing.T) {
	n := newNode(t)
	n.addPrimary(t, "10-calico.conflist")
	for name, data := range map[string]string{
		"01-broken.conflist":     `{"name":"x","plugins":[`,
		"02-notype.conf":         `{"name":"x"}`,
		"05-coordino.conflist":   `{"name":"old","plugins":[{"type":"coordino"}]}`, // ours, from primary mode
		".coordino-tmp-leftover": "half a fi",
		"03-backup.conflist.bak": `{}`,
	} {
		os.WriteFile(filepath.Join(n.conf, name), []byte(data), 0o644)
	}
	in := n.installer(t, ModeChained, conflist.Knobs{})
	if err := in.Install(); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(in.ConfPath())
	c, err := conflist.Parse(got, in.ConfPath())
	if err != nil || c.Name() != "k8s-pod-network" {
		t.Fatalf("chained from the wrong file: %s %v", got, err)
	}
	snap := snapshot(t, n.conf)
	if _, ok := snap["05-coordino.conflist"]; ok {
		t.Fatal("old primary-mode file of ours kept")
	}
	if _, ok := snap[".coordino-tmp-leftover"]; ok {
		t.Fatal("stale temp file kept")
	}
	if snap["01-broken.conflist"] != `{"name":"x","plugins":[` {
		t.Fatal("someone else's file changed")
	}
}

func TestChainedPriorityMustSortFirst(t *testing.T) {
	n := newNode(t)
	data, _ := os.ReadFile(filepath.Join(fixtureDir, "10-flannel.conflist"))
	os.WriteFile(filepath.Join(n.conf, "00-aaa.conflist"), data, 0o644)
	in := n.installer(t, ModeChained, conflist.Knobs{})
	err := in.Install()
	if err == nil || !strings.Contains(err.Error(), "use a lower priority") {
		t.Fatalf("err = %v", err)
	}
}

func TestModeSwitch(t *testing.T) {
	n := newNode(t)
	n.addPrimary(t, "10-aws.conflist")
	if err := n.installer(t, ModePrimary, conflist.Knobs{}).Install(); err != nil {
		t.Fatal(err)
	}
	in := n.installer(t, ModeChained, conflist.Knobs{})
	if err := in.Install(); err != nil {
		t.Fatal(err)
	}
	got := keys(snapshot(t, n.conf))
	if want := []string{".coordino-install.lock", "00-coordino-chained.conflist", "10-aws.conflist"}; !slices.Equal(got, want) {
		t.Fatalf("conf dir %v, want %v", got, want)
	}
}

func TestPluginUpdate(t *testing.T) {
	n := newNode(t)
	in := n.installer(t, ModePrimary, conflist.Knobs{})
	if err := in.Install(); err != nil {
		t.Fatal(err)
	}
	n.srcData[0]++
	os.WriteFile(n.src, n.srcData, 0o755)
	in2 := n.installer(t, ModePrimary, conflist.Knobs{})
	if err := in2.Install(); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(n.bin, "coordino"))
	if in2.Writes() != 1 || !bytes.Equal(got, n.srcData) {
		t.Fatalf("writes=%d, plugin updated=%v", in2.Writes(), bytes.Equal(got, n.srcData))
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Mode: "both"}, `mode: "both"`},
		{Config{Priority: "1a"}, `priority: "1a"`},
		{Config{Conflist: conflist.Options{Knobs: conflist.Knobs{MTU: 1}}}, "mtu: 1"},
	} {
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) err = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestMissingPluginSource(t *testing.T) {
	n := newNode(t)
	os.Remove(n.src)
	err := n.installer(t, ModePrimary, conflist.Knobs{}).Install()
	if err == nil || !strings.Contains(err.Error(), "plugin-source") || !strings.Contains(err.Error(), n.src) {
		t.Fatalf("err = %v", err)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

func keys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
