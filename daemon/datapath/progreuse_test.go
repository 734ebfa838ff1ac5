package datapath

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"go.uber.org/zap/zaptest"

	"github.com/coordino/coordino/bpf"
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

	// A scratch map the programs keep is part of what they are built with.
	fourth := open(Config{MapSizes: MapSizes{Frags: 1 << 12}})
	if fourth.programsReused {
		t.Fatal("programs reused with another fragment map size")
	}
	id = programID(t, fourth.objs.CdoFromEp)
	fourth.Close()

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

// programMap is the map named name that prog uses, as the kernel says.
func programMap(t *testing.T, prog *ebpf.Program, name string) *ebpf.Map {
	t.Helper()
	m := programMapOrNil(t, prog, name)
	if m == nil {
		t.Fatalf("program uses no map %s", name)
	}
	return m
}

func programMapOrNil(t *testing.T, prog *ebpf.Program, name string) *ebpf.Map {
	t.Helper()
	info, err := prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	ids, ok := info.MapIDs()
	if !ok {
		t.Fatal("program info without map IDs")
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			t.Fatal(err)
		}
		mi, err := m.Info()
		if err == nil && mi.Name == name {
			t.Cleanup(func() { m.Close() })
			return m
		}
		m.Close()
	}
	return nil
}

// After a restart that reuses the pinned programs, the daemon holds the
// maps those programs use, unpinned ones included: ForgetNextHops empties
// the FIB cache the programs read, and no map the programs use has a
// second copy on the daemon's side.
func TestReusedProgramsShareTheDaemonsMaps(t *testing.T) {
	privileged.Require(t)
	dir := testnet.BPFDir(t)
	first, err := Open(Config{BPFDir: dir, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	dp, err := Open(Config{BPFDir: dir, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if !dp.programsReused {
		t.Fatal("the second Open did not reuse the programs")
	}

	cache := programMap(t, dp.objs.CdoFromEp, "cdo_fib_cache")
	entries := make([]bpf.CoordinoHrFibEntry, ebpf.MustPossibleCPU())
	for c := range entries {
		entries[c].ExpiresNs = ^uint64(0)
	}
	if err := cache.Put(uint32(7), entries); err != nil {
		t.Fatal(err)
	}
	if err := dp.ForgetNextHops(); err != nil {
		t.Fatal(err)
	}
	if err := cache.Lookup(uint32(7), &entries); err != nil {
		t.Fatal(err)
	}
	for c, e := range entries {
		if e.ExpiresNs != 0 {
			t.Fatalf("CPU %d: the programs' FIB cache still holds an answer after ForgetNextHops", c)
		}
	}

	for name, m := range taggedMaps(&dp.objs.CoordinoMaps) {
		if name == "cdo_fib_cache" || strings.HasPrefix(name, ".") {
			continue
		}
		used := programMapByName(t, &dp.objs.CoordinoPrograms, name)
		if used == nil {
			continue // no program uses it
		}
		if mapID(t, m) != mapID(t, used) {
			t.Errorf("map %s: the daemon holds map %d, the reused programs use %d", name, mapID(t, m), mapID(t, used))
		}
	}
}

func mapID(t *testing.T, m *ebpf.Map) ebpf.MapID {
	t.Helper()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("map without ID")
	}
	return id
}

// programMapByName is the map named name that any program of ps uses, or nil.
func programMapByName(t *testing.T, ps *bpf.CoordinoPrograms, name string) *ebpf.Map {
	t.Helper()
	var found *ebpf.Map
	_ = programFields(ps, func(_ string, field reflect.Value) error {
		if found == nil {
			found = programMapOrNil(t, field.Interface().(*ebpf.Program), name)
		}
		return nil
	})
	return found
}
