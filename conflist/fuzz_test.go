package conflist

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

var fuzzExts = []string{".conflist", ".conf", ".json"}

// FuzzParse feeds arbitrary bytes to the parser and, for every input it
// accepts, checks that writing back is lossless and that removing what
// InsertCoordino added gives back an equivalent config.
func FuzzParse(f *testing.F) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		if !IsConfigFile(e.Name()) {
			continue
		}
		data, err := os.ReadFile(filepath.Join("testdata", e.Name()))
		if err != nil {
			f.Fatal(err)
		}
		for i, ext := range fuzzExts {
			if ext == filepath.Ext(e.Name()) {
				f.Add(data, uint8(i))
			}
		}
	}
	f.Add([]byte(`{"name":"n","type":"coordino"}`), uint8(1))
	f.Add([]byte(`{"name":"n","plugins":[{"type":"a"},{"type":"coordino","mtu":1}]}`), uint8(0))
	f.Add([]byte(`{"name":"n","plugins":[{"type":"a","x":"\u00e9\ud83d\ude00"}]}`), uint8(2))
	f.Add([]byte(`{"name":"n","plugins":[{"type":"a"}],"plugins":[]}`), uint8(0))

	f.Fuzz(func(t *testing.T, data []byte, extIdx uint8) {
		file := "f" + fuzzExts[int(extIdx)%len(fuzzExts)]
		c, err := Parse(data, file)
		if err != nil {
			return
		}
		out := c.Bytes()
		if got, want := compact(t, out), compact(t, data); got != want {
			t.Fatalf("Bytes changed the config:\n got %s\nwant %s", got, want)
		}
		hasCoordino := false
		for _, typ := range c.PluginTypes() {
			hasCoordino = hasCoordino || typ == PluginType
		}

		ins, changed, err := InsertCoordino(data, file, Knobs{MTU: 1450})
		if err != nil {
			t.Fatalf("InsertCoordino failed on a valid config: %v", err)
		}
		if !hasCoordino && !changed {
			t.Fatal("InsertCoordino reported no change but coordino was absent")
		}
		insFile := file
		if changed && !hasCoordino {
			insFile = "f.conflist"
		}
		again, changed2, err := InsertCoordino(ins, insFile, Knobs{MTU: 1450})
		if err != nil || changed2 || !bytes.Equal(again, ins) {
			t.Fatalf("InsertCoordino not idempotent: changed=%v err=%v", changed2, err)
		}
		if hasCoordino {
			if _, _, err := RemoveCoordino(data, file); err != nil && !errors.Is(err, ErrLastPlugin) {
				t.Fatalf("RemoveCoordino: %v", err)
			}
			return
		}
		back, _, err := RemoveCoordino(ins, insFile)
		if err != nil {
			t.Fatalf("RemoveCoordino(InsertCoordino(x)): %v", err)
		}
		if c.Format == FormatList {
			if got, want := compact(t, back), compact(t, data); got != want {
				t.Fatalf("Remove(Insert(x)) != x:\n got %s\nwant %s", got, want)
			}
			return
		}
		conf, err := ListToConf(back, "f.conflist")
		if err != nil {
			t.Fatalf("ListToConf(Remove(Insert(conf))): %v", err)
		}
		if !sameJSON(t, conf, data) {
			t.Fatalf("conf round trip not equivalent:\n got %s\nwant %s", conf, data)
		}
	})
}
