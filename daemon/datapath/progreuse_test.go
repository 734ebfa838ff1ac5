package datapath

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"go.uber.org/zap/zaptest"

	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/test/privileged"
)

func programID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("program without ID")
	}
	return id
}

func progDirs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), progDirPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// A restart with the same programs against the same maps reuses the
// programs the last start pinned instead of loading them again; a map
// replaced (here the conntrack table, resized) means programs loaded anew
// against it, and the old programs' pins go.
func TestOpenReusesUnchangedPrograms(t *testing.T) {
	privileged.Require(t)
	dir := testnet.BPFDir(t)
	open := func(cfg Config) *Datapath {
		t.Helper()
		cfg.BPFDir, cfg.Logger = dir, zaptest.NewLogger(t)
		dp, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return dp
	}
	first := open(Config{})
	if first.programsReused {
		t.Fatal("first Open reused programs from an empty BPF dir")
	}
	id := programID(t, first.objs.CdoFromEp)
	first.Close()

	second := open(Config{})
	if !second.programsReused || programID(t, second.objs.CdoFromEp) != id {
		t.Fatalf("restart: reused %v, program %d, want the pinned %d", second.programsReused, programID(t, second.objs.CdoFromEp), id)
	}
	second.Close()
	if dirs := progDirs(t, dir); len(dirs) != 1 {
		t.Fatalf("program dirs %v, want one", dirs)
	}

	third := open(Config{ConntrackSize: DefaultConntrackSize / 2})
	defer third.Close()
	if third.programsReused || programID(t, third.objs.CdoFromEp) == id {
		t.Fatal("programs reused against a replaced conntrack map")
	}
	dirs := progDirs(t, dir)
	if len(dirs) != 1 {
		t.Fatalf("program dirs %v, want only the new one", dirs)
	}
	if _, err := os.Stat(filepath.Join(dir, dirs[0], "cdo_from_ep")); err != nil {
		t.Fatal(err)
	}
}
