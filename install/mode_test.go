package install

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/coordino/coordino/conflist"
)

func permOf(t *testing.T, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// TestChainedConfigKeepsPrimaryMode: the chained file is a copy of the
// primary's config, which can be private; it must never be more readable
// than the primary's file, and follows it when the primary is chmodded.
// Before, it was always written 0644.
func TestChainedConfigKeepsPrimaryMode(t *testing.T) {
	n := newNode(t)
	file := shapes[0].file
	n.addPrimary(t, file)
	primary := filepath.Join(n.conf, file)
	if err := os.Chmod(primary, 0o600); err != nil {
		t.Fatal(err)
	}
	in := n.installer(t, ModeChained, conflist.Knobs{})
	if err := in.Install(); err != nil {
		t.Fatal(err)
	}
	if got := permOf(t, in.ConfPath()); got != 0o600 {
		t.Fatalf("chained config mode %v, primary's is 0600", got)
	}
	if err := os.Chmod(primary, 0o640); err != nil {
		t.Fatal(err)
	}
	before := in.Writes()
	if err := in.Reconcile(); err != nil {
		t.Fatal(err)
	}
	if got := permOf(t, in.ConfPath()); got != 0o640 || in.Writes() != before+1 {
		t.Fatalf("after chmod of the primary: mode %v (want 0640), writes %d", got, in.Writes()-before)
	}
	// Nothing changed: nothing written.
	if err := in.Reconcile(); err != nil || in.Writes() != before+1 {
		t.Fatalf("idle reconcile wrote (%v)", err)
	}
	p := n.installer(t, ModePrimary, conflist.Knobs{})
	if err := p.Install(); err != nil {
		t.Fatal(err)
	}
	if got := permOf(t, p.ConfPath()); got != 0o644 {
		t.Fatalf("primary-mode config mode %v, want 0644", got)
	}
}
