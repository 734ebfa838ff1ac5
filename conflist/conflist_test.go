package conflist

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

type fixture struct {
	file       string
	name       string
	cniVersion string
	types      []string
	format     Format
}

var fixtures = []fixture{
	{"10-calico.conflist", "k8s-pod-network", "0.3.1", []string{"calico", "bandwidth", "portmap"}, FormatList},
	{"10-flannel.conflist", "cbr0", "0.3.1", []string{"flannel", "portmap"}, FormatList},
	{"10-aws.conflist", "aws-cni", "0.4.0", []string{"aws-cni", "egress-cni", "portmap"}, FormatList},
	{"05-cilium.conflist", "cilium", "0.3.1", []string{"cilium-cni"}, FormatList},
	{"10-bridge.conf", "mynet", "0.4.0", []string{"bridge"}, FormatConf},
	{"20-bridge-versions.conflist", "bridge-net", "1.0.0", []string{"bridge", "portmap", "tuning"}, FormatList},
	{"30-ptp.json", "ptp-json", "0.3.1", []string{"ptp"}, FormatConf},
	{"40-list.json", "json-list", "1.1.0", []string{"ptp", "firewall"}, FormatList},
}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func compact(t testing.TB, data []byte) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		t.Fatalf("compact %q: %v", data, err)
	}
	return buf.String()
}

// sameJSON reports whether a and b decode to the same value, ignoring key
// order and whitespace but not number text.
func sameJSON(t testing.TB, a, b []byte) bool {
	t.Helper()
	decode := func(data []byte) any {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("decode %q: %v", data, err)
		}
		return v
	}
	return reflect.DeepEqual(decode(a), decode(b))
}

// libcniTypes loads data the way a runtime does and returns the plugin types.
func libcniTypes(t *testing.T, data []byte, format Format) []string {
	t.Helper()
	var list *libcni.NetworkConfigList
	var err error
	if format == FormatConf {
		var conf *libcni.NetworkConfig
		if conf, err = libcni.ConfFromBytes(data); err == nil {
			list, err = libcni.ConfListFromConf(conf)
		}
	} else {
		list, err = libcni.ConfListFromBytes(data)
	}
	if err != nil {
		t.Fatalf("libcni refuses %s:\n%s\n%v", format, data, err)
	}
	var types []string
	for _, p := range list.Plugins {
		types = append(types, p.Network.Type)
	}
	return types
}

func TestBuildDefault(t *testing.T) {
	got, err := Build(Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := `{
  "cniVersion": "1.1.0",
  "name": "coordino",
  "plugins": [
    {
      "type": "coordino"
    }
  ]
}
`
	if string(got) != want {
		t.Fatalf("Build(defaults) =\n%s\nwant\n%s", got, want)
	}
	list, err := libcni.ConfListFromBytes(got)
	if err != nil {
		t.Fatal(err)
	}
	if list.Name != DefaultName || list.CNIVersion != DefaultCNIVersion || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != PluginType {
		t.Fatalf("libcni sees %+v", list)
	}
}

func TestBuildKnobs(t *testing.T) {
	got, err := Build(Options{Name: "pods", CNIVersion: "1.0.0", Knobs: Knobs{RunDir: "/run/x", MTU: 1450, LogLevel: "debug"}})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"coordino","runDir":"/run/x","mtu":1450,"logLevel":"debug"}]}`
	if c := compact(t, got); c != want {
		t.Fatalf("got %s\nwant %s", c, want)
	}
}

func TestBuildRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Knobs: Knobs{MTU: 20}}, "mtu: 20"},
		{Options{Knobs: Knobs{MTU: 575}}, "mtu: 575"}, // the daemon would refuse every ADD
		{Options{Knobs: Knobs{MTU: 70000}}, "mtu: 70000"},
		{Options{Knobs: Knobs{LogLevel: "loud"}}, `logLevel: "loud"`},
		{Options{Knobs: Knobs{RunDir: "run/coordino"}}, `runDir: "run/coordino"`},
		{Options{Knobs: Knobs{RunDir: "/run/../x"}}, `runDir: "/run/../x"`},
		{Options{Name: "  "}, "name: empty"},
	} {
		_, err := Build(tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Build(%+v) error = %v, want it to mention %q", tc.opts, err, tc.want)
		}
	}
}

func TestParseFixtures(t *testing.T) {
	for _, fx := range fixtures {
		t.Run(fx.file, func(t *testing.T) {
			data := readFixture(t, fx.file)
			c, err := Parse(data, fx.file)
			if err != nil {
				t.Fatal(err)
			}
			if c.Format != fx.format || c.Name() != fx.name || c.CNIVersion() != fx.cniVersion || !slices.Equal(c.PluginTypes(), fx.types) {
				t.Fatalf("parsed %s %q %q %v, want %s %q %q %v", c.Format, c.Name(), c.CNIVersion(), c.PluginTypes(), fx.format, fx.name, fx.cniVersion, fx.types)
			}
			// Writing back changes whitespace only: same keys, order and value text.
			if got, want := compact(t, c.Bytes()), compact(t, data); got != want {
				t.Fatalf("round trip changed the config:\n got %s\nwant %s", got, want)
			}
			if got := libcniTypes(t, data, fx.format); !slices.Equal(got, fx.types) {
				t.Fatalf("libcni types %v, want %v", got, fx.types)
			}
		})
	}
}

func TestInsertRemoveFixtures(t *testing.T) {
	knobs := Knobs{MTU: 1400, LogLevel: "info"}
	for _, fx := range fixtures {
		t.Run(fx.file, func(t *testing.T) {
			orig := readFixture(t, fx.file)
			out, changed, err := InsertCoordino(orig, fx.file, knobs)
			if err != nil || !changed {
				t.Fatalf("InsertCoordino: changed=%v err=%v", changed, err)
			}
			// The result is always a list; a runtime sees the old chain plus coordino.
			wantTypes := append(slices.Clone(fx.types), PluginType)
			if got := libcniTypes(t, out, FormatList); !slices.Equal(got, wantTypes) {
				t.Fatalf("after insert libcni sees %v, want %v", got, wantTypes)
			}
			list, _ := libcni.ConfListFromBytes(out)
			if list.Name != fx.name || list.CNIVersion != fx.cniVersion && fx.file != "20-bridge-versions.conflist" {
				t.Fatalf("insert changed network identity: %q %q", list.Name, list.CNIVersion)
			}
			var last map[string]any
			_ = json.Unmarshal(list.Plugins[len(list.Plugins)-1].Bytes, &last)
			if last["mtu"] != 1400.0 || last["logLevel"] != "info" || len(last) != 3 {
				t.Fatalf("coordino entry = %v", last)
			}
			// Every original plugin is kept verbatim (modulo whitespace), in order.
			c, _ := Parse(orig, fx.file)
			c.toList()
			after, _ := Parse(out, "x.conflist")
			for i, p := range c.plugins {
				if got, want := compact(t, after.plugins[i].compact()), compact(t, p.compact()); got != want {
					t.Fatalf("plugins[%d] changed:\n got %s\nwant %s", i, got, want)
				}
			}
			for _, m := range c.top {
				if m.key == "plugins" {
					continue
				}
				v, _ := after.top.get(m.key)
				if compact(t, v) != compact(t, m.val) {
					t.Fatalf("top-level %s changed: %s -> %s", m.key, m.val, v)
				}
			}

			// Idempotent: same knobs leave the exact bytes alone.
			again, changed, err := InsertCoordino(out, "x.conflist", knobs)
			if err != nil || changed || !bytes.Equal(again, out) {
				t.Fatalf("re-insert: changed=%v err=%v", changed, err)
			}

			// Different knobs update the entry in place.
			upd, changed, err := InsertCoordino(out, "x.conflist", Knobs{MTU: 9000})
			if err != nil || !changed {
				t.Fatalf("update knobs: changed=%v err=%v", changed, err)
			}
			updc, _ := Parse(upd, "x.conflist")
			if !slices.Equal(updc.PluginTypes(), wantTypes) {
				t.Fatalf("update moved plugins: %v", updc.PluginTypes())
			}
			if got := string(updc.plugins[len(updc.plugins)-1].compact()); got != `{"type":"coordino","mtu":9000}` {
				t.Fatalf("updated entry = %s", got)
			}

			// Remove restores the original.
			back, changed, err := RemoveCoordino(upd, "x.conflist")
			if err != nil || !changed {
				t.Fatalf("RemoveCoordino: changed=%v err=%v", changed, err)
			}
			if fx.format == FormatList {
				if got, want := compact(t, back), compact(t, orig); got != want {
					t.Fatalf("remove(insert(x)) != x:\n got %s\nwant %s", got, want)
				}
			} else {
				conf, err := ListToConf(back, "x.conflist")
				if err != nil {
					t.Fatal(err)
				}
				if !sameJSON(t, conf, orig) {
					t.Fatalf("ListToConf(remove(insert(x))) not equivalent to x:\n%s\n%s", conf, orig)
				}
				// The usual key order (cniVersion, name, ...) survives exactly.
				if got, want := compact(t, conf), compact(t, orig); got != want {
					t.Fatalf("key order changed:\n got %s\nwant %s", got, want)
				}
			}
			// Removing again is a no-op on the exact bytes.
			if again, changed, err := RemoveCoordino(back, "x.conflist"); err != nil || changed || !bytes.Equal(again, back) {
				t.Fatalf("second remove: changed=%v err=%v", changed, err)
			}
		})
	}
}

func TestInsertIntoOwnConflistIsNoop(t *testing.T) {
	own, _ := Build(Options{Knobs: Knobs{MTU: 1450}})
	out, changed, err := InsertCoordino(own, DefaultFilename, Knobs{MTU: 1450})
	if err != nil || changed || !bytes.Equal(out, own) {
		t.Fatalf("changed=%v err=%v", changed, err)
	}
	if _, _, err := RemoveCoordino(own, DefaultFilename); !errors.Is(err, ErrLastPlugin) {
		t.Fatalf("RemoveCoordino(own) err = %v, want ErrLastPlugin", err)
	}
}

func TestCoordinoConf(t *testing.T) {
	conf := []byte(`{"cniVersion":"1.0.0","name":"n","type":"coordino","mtu":1300,"extra":{"a":1}}`)
	out, changed, err := InsertCoordino(conf, "c.conf", Knobs{MTU: 1300})
	if err != nil || changed || !bytes.Equal(out, conf) {
		t.Fatalf("same knobs: changed=%v err=%v", changed, err)
	}
	out, changed, err = InsertCoordino(conf, "c.conf", Knobs{LogLevel: "warn"})
	if err != nil || !changed {
		t.Fatalf("new knobs: changed=%v err=%v", changed, err)
	}
	// A conf stays a conf when nothing is appended; unowned keys stay put.
	if got := compact(t, out); got != `{"cniVersion":"1.0.0","name":"n","type":"coordino","extra":{"a":1},"logLevel":"warn"}` {
		t.Fatalf("got %s", got)
	}
}

func TestListToConfConflict(t *testing.T) {
	list := []byte(`{"name":"a","plugins":[{"type":"x","name":"b"}]}`)
	_, err := ListToConf(list, "l.conflist")
	if err == nil || !strings.Contains(err.Error(), "plugins[0].name") {
		t.Fatalf("err = %v", err)
	}
	two := []byte(`{"name":"a","plugins":[{"type":"x"},{"type":"y"}]}`)
	if _, err := ListToConf(two, "l.conflist"); err == nil || !strings.Contains(err.Error(), "has 2 plugins") {
		t.Fatalf("err = %v", err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		file, data, want string
	}{
		{"a.conflist", ``, "parse a.conflist: invalid JSON"},
		{"a.conflist", `[]`, "parse a.conflist: must be a JSON object, got an array"},
		{"a.conflist", `{"name":"x","plugins":[{"type":"a"}]} {}`, "trailing data"},
		{"a.conflist", `{"name":"x","plugins":[{"type":"a"}]`, "invalid JSON"},
		{"a.conflist", `{"plugins":[{"type":"a"}]}`, "parse a.conflist: name: missing"},
		{"a.conflist", `{"name":"","plugins":[{"type":"a"}]}`, "parse a.conflist: name: empty"},
		{"a.conflist", `{"name":7,"plugins":[{"type":"a"}]}`, "parse a.conflist: name: must be a string, got a number"},
		{"a.conflist", `{"name":"x","name":"y","plugins":[{"type":"a"}]}`, "parse a.conflist: name: duplicate key"},
		{"a.conflist", `{"name":"x"}`, "parse a.conflist: plugins: missing"},
		{"a.conflist", `{"name":"x","plugins":null}`, "parse a.conflist: plugins: must be an array, got null"},
		{"a.conflist", `{"name":"x","plugins":[]}`, "parse a.conflist: plugins: empty"},
		{"a.conflist", `{"name":"x","plugins":[{"type":"a"},{"type":"b"},{"ipam":{}}]}`, "parse a.conflist: plugins[2].type: missing"},
		{"a.conflist", `{"name":"x","plugins":[{"type":"a"},"b"]}`, "parse a.conflist: plugins[1]: must be a JSON object, got a string"},
		{"a.conflist", `{"name":"x","plugins":[{"type":""}]}`, "plugins[0].type: empty"},
		{"a.conflist", `{"name":"x","plugins":[{"type":["a"]}]}`, "plugins[0].type: must be a string, got an array"},
		{"a.conflist", `{"name":"x","plugins":[{"type":"a","type":"b"}]}`, "plugins[0]: type: duplicate key"},
		{"a.conflist", `{"name":"x","cniVersion":1,"plugins":[{"type":"a"}]}`, "cniVersion: must be a string"},
		{"a.conflist", `{"name":"x","cniVersions":"1.0.0","plugins":[{"type":"a"}]}`, "cniVersions: must be an array of strings"},
		{"a.conflist", `{"name":"x","disableCheck":"maybe","plugins":[{"type":"a"}]}`, `disableCheck: must be a boolean, got "maybe"`},
		{"a.conflist", `{"name":"x","disableGC":1,"plugins":[{"type":"a"}]}`, `disableGC: must be a boolean, got 1`},
		{"a.conf", `{"name":"x"}`, "parse a.conf: type: missing"},
		{"a.conf", `{"type":"bridge"}`, "parse a.conf: name: missing"},
		{"a.json", `{"type":"bridge","name":"x","plugins":[]}`, "parse a.json: plugins: empty"},
		{"a.yaml", `{"type":"bridge","name":"x"}`, `parse a.yaml: file name: extension ".yaml"`},
	} {
		_, err := Parse([]byte(tc.data), tc.file)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s, %q) error = %v, want it to contain %q", tc.file, tc.data, err, tc.want)
		}
		if _, _, err := InsertCoordino([]byte(tc.data), tc.file, Knobs{}); err == nil {
			t.Errorf("InsertCoordino accepted invalid %s %q", tc.file, tc.data)
		}
	}
}

func TestLibcniLenientBooleans(t *testing.T) {
	// libcni accepts "true"/"false" strings for these; so must we, or chaining
	// would refuse configs that runtimes load.
	data := []byte(`{"name":"x","disableCheck":"TRUE","disableGC":false,"plugins":[{"type":"a"}]}`)
	if _, err := Parse(data, "a.conflist"); err != nil {
		t.Fatal(err)
	}
}

func TestIsConfigFile(t *testing.T) {
	for name, want := range map[string]bool{
		"10-a.conf": true, "10-a.conflist": true, "a.json": true,
		".coordino-tmp-123": false, "a.conflist.bak": false, "a.cilium_bak": false, "README": false,
	} {
		if got := IsConfigFile(name); got != want {
			t.Errorf("IsConfigFile(%q) = %v", name, got)
		}
	}
}

func TestKeyTextKeptVerbatim(t *testing.T) {
	data := []byte(`{"name":"n","x\u002dkey":"\u00e9","plugins":[{"ty\u0070e":"a","k\"q":1.50E+2}]}`)
	c, err := Parse(data, "k.conflist")
	if err != nil {
		t.Fatal(err)
	}
	if got := compact(t, c.Bytes()); got != string(data) {
		t.Fatalf("got %s", got)
	}
	if !slices.Equal(c.PluginTypes(), []string{"a"}) {
		t.Fatalf("types %v", c.PluginTypes())
	}
}

func TestRejectsInvalidUTF8(t *testing.T) {
	_, err := Parse([]byte("{\"name\":\"\xff\",\"type\":\"a\"}"), "u.conf")
	if err == nil || !strings.Contains(err.Error(), "parse u.conf: invalid JSON: not valid UTF-8") {
		t.Fatalf("err = %v", err)
	}
}

// TestBuildPortMap: with PortMap the primary conflist chains portmap after
// Coordino asking for the pod's port mappings, as libcni reads it.
func TestBuildPortMap(t *testing.T) {
	for _, tc := range []struct {
		backend, want string
	}{
		{"", `{"cniVersion":"1.1.0","name":"coordino","plugins":[{"type":"coordino"},{"type":"portmap","capabilities":{"portMappings":true}}]}`},
		{"nftables", `{"cniVersion":"1.1.0","name":"coordino","plugins":[{"type":"coordino"},{"type":"portmap","capabilities":{"portMappings":true},"backend":"nftables"}]}`},
	} {
		got, err := Build(Options{PortMap: true, PortMapBackend: tc.backend})
		if err != nil {
			t.Fatal(err)
		}
		if c := compact(t, got); c != tc.want {
			t.Errorf("backend %q: got %s\nwant %s", tc.backend, c, tc.want)
		}
		list, err := libcni.ConfListFromBytes(got)
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Plugins) != 2 || list.Plugins[1].Network.Type != PortMapType || !list.Plugins[1].Network.Capabilities["portMappings"] {
			t.Errorf("libcni sees plugins %+v", list.Plugins)
		}
	}
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{PortMap: true, PortMapBackend: "ipvs"}, `portmap backend: "ipvs"`},
		{Options{PortMapBackend: "nftables"}, "portmap backend: set without portmap"},
	} {
		if _, err := Build(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Build(%+v) error = %v, want it to mention %q", tc.opts, err, tc.want)
		}
	}
}
