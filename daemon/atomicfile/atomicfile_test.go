package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplacesWithModeAndLeavesNoTemporaries(t *testing.T) {
	for name, write := range map[string]func(string, []byte, os.FileMode) error{"Write": Write, "WriteVolatile": WriteVolatile} {
		t.Run(name, func(t *testing.T) { testReplaces(t, write) })
	}
}

func testReplaces(t *testing.T, write func(string, []byte, os.FileMode) error) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := write(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "new" {
		t.Fatalf("content = %q, %v; want new", got, err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode = %v, %v; want 0600", st.Mode().Perm(), err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only the file", len(entries))
	}
}

func TestWriteIntoMissingDirFails(t *testing.T) {
	if err := Write(filepath.Join(t.TempDir(), "missing", "f"), []byte("x"), 0o600); err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}

// TestRemoveTempsLeavesOthers: the temporaries of one file a killed writer
// left go; the file itself, another file's temporaries and other files stay.
func TestRemoveTempsLeavesOthers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	keep := []string{"state.json", ".tmp-other.json-1", "state.json.bak"}
	for _, name := range append([]string{".tmp-state.json-123", ".tmp-state.json-456"}, keep...) {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := RemoveTemps(path); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if len(got) != len(keep) {
		t.Fatalf("left %v, want %v", got, keep)
	}
	if err := RemoveTemps(filepath.Join(t.TempDir(), "gone", "x")); err != nil {
		t.Fatalf("missing directory: %v", err)
	}
}
