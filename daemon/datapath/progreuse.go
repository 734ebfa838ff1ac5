package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/bpf"
)

// progDirPrefix starts the name of the directory under BPFDir holding the
// pinned programs of one fingerprint (programFingerprint).
const progDirPrefix = "progs-"

// loadObjects loads the maps, creating or adopting their pins, then the
// programs. Programs a previous start pinned are reused when they were
// built from the same instructions and constants against the same pinned
// maps (the fingerprint names their directory): loading them again would
// cost the verifier's time, most of a restart, for the same programs.
// Otherwise the programs are loaded against exactly the maps just opened,
// and pinned for the next start. reused says which happened.
func loadObjects(spec *ebpf.CollectionSpec, dir string, objs *bpf.CoordinoObjects) (reused bool, err error) {
	opts := ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}
	if err := spec.LoadAndAssign(&objs.CoordinoMaps, &opts); err != nil {
		return false, err
	}
	maps := taggedMaps(&objs.CoordinoMaps)
	fp, err := programFingerprint(spec, maps)
	if err != nil {
		return false, err
	}
	progDir := filepath.Join(dir, progDirPrefix+fp)
	if loadPinnedPrograms(progDir, &objs.CoordinoPrograms) == nil {
		if err := adoptScratchMaps(spec, &objs.CoordinoPrograms, &objs.CoordinoMaps); err == nil {
			removeStaleProgramDirs(dir, progDir)
			return true, nil
		}
		objs.CoordinoPrograms.Close() // loaded anew below
		objs.CoordinoPrograms = bpf.CoordinoPrograms{}
	}
	opts.MapReplacements = maps
	if err := spec.LoadAndAssign(&objs.CoordinoPrograms, &opts); err != nil {
		return false, err
	}
	if err := pinPrograms(progDir, &objs.CoordinoPrograms); err != nil {
		return false, err
	}
	removeStaleProgramDirs(dir, progDir)
	return false, nil
}

// taggedMaps returns the maps of a bpf2go struct by their ELF names.
func taggedMaps(s *bpf.CoordinoMaps) map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	v := reflect.ValueOf(s).Elem()
	for i := range v.NumField() {
		if m, ok := v.Field(i).Interface().(*ebpf.Map); ok && m != nil {
			out[v.Type().Field(i).Tag.Get("ebpf")] = m
		}
	}
	return out
}

// adoptScratchMaps puts in s, in place of the copies just created, the
// unpinned maps the reused programs p use: those are the programs' own
// since their first load, so the daemon then reads and empties what the
// programs read, and no second copy stays allocated. A map no program uses
// keeps its copy.
func adoptScratchMaps(spec *ebpf.CollectionSpec, p *bpf.CoordinoPrograms, s *bpf.CoordinoMaps) error {
	byKernelName := map[string]string{} // the kernel keeps 15 bytes of a name
	for name, ms := range spec.Maps {
		if !strings.HasPrefix(name, ".") && ms.Pinning != ebpf.PinByName {
			byKernelName[name[:min(len(name), unix.BPF_OBJ_NAME_LEN-1)]] = name
		}
	}
	seen := map[ebpf.MapID]bool{}
	return programFields(p, func(_ string, field reflect.Value) error {
		info, err := field.Interface().(*ebpf.Program).Info()
		if err != nil {
			return fmt.Errorf("datapath: inspect reused program: %w", err)
		}
		ids, _ := info.MapIDs()
		for _, id := range ids {
			if seen[id] {
				continue
			}
			seen[id] = true
			m, err := ebpf.NewMapFromID(id)
			if err != nil {
				return fmt.Errorf("datapath: open map %d of a reused program: %w", id, err)
			}
			mi, err := m.Info()
			name, scratch := byKernelName[mi.Name]
			if err != nil || !scratch || !replaceTaggedMap(s, name, m) {
				m.Close()
			}
		}
		return nil
	})
}

// replaceTaggedMap puts m in the field of s whose ELF name is name, closing
// what was there; false when s has no such field.
func replaceTaggedMap(s *bpf.CoordinoMaps, name string, m *ebpf.Map) bool {
	v := reflect.ValueOf(s).Elem()
	for i := range v.NumField() {
		if v.Type().Field(i).Tag.Get("ebpf") != name {
			continue
		}
		if old, ok := v.Field(i).Interface().(*ebpf.Map); ok && old != nil {
			old.Close()
		}
		v.Field(i).Set(reflect.ValueOf(m))
		return true
	}
	return false
}

// programFingerprint identifies what the programs are built from: their
// instructions, the constants and initial globals (internal maps' contents,
// which hold the kernel-feature switches) and the kernel IDs of the pinned
// maps they use, so a map replaced (resized, re-created) means new
// programs. Maps no pin holds are the programs' private scratch (fragment
// tracking, event budgets): a reused program keeps its own, which the
// daemon adopts (adoptScratchMaps).
func programFingerprint(spec *ebpf.CollectionSpec, maps map[string]*ebpf.Map) (string, error) {
	h := sha256.New()
	for _, name := range slices.Sorted(mapsKeys(spec.Programs)) {
		ps := spec.Programs[name]
		fmt.Fprintf(h, "program %s %v %v %s\n%v\n", name, ps.Type, ps.AttachType, ps.License, ps.Instructions)
	}
	for _, name := range slices.Sorted(mapsKeys(spec.Maps)) {
		ms := spec.Maps[name]
		switch {
		case strings.HasPrefix(name, "."):
			fmt.Fprintf(h, "internal %s %v\n", name, ms.Contents)
		case ms.Pinning != ebpf.PinByName:
			// A reused program keeps its scratch map: a new size means new programs.
			fmt.Fprintf(h, "scratch %s %d\n", name, ms.MaxEntries)
		case ms.Pinning == ebpf.PinByName:
			m := maps[name]
			if m == nil {
				return "", fmt.Errorf("datapath: map %s not loaded", name)
			}
			info, err := m.Info()
			if err != nil {
				return "", fmt.Errorf("datapath: inspect map %s: %w", name, err)
			}
			id, ok := info.ID()
			if !ok {
				return "", fmt.Errorf("datapath: map %s has no ID", name)
			}
			fmt.Fprintf(h, "pinned %s %d\n", name, id)
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:12]), nil
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// programFields calls f with each program field of s and its ELF name.
func programFields(s *bpf.CoordinoPrograms, f func(name string, field reflect.Value) error) error {
	v := reflect.ValueOf(s).Elem()
	for i := range v.NumField() {
		if err := f(v.Type().Field(i).Tag.Get("ebpf"), v.Field(i)); err != nil {
			return err
		}
	}
	return nil
}

// loadPinnedPrograms fills s from the pins in dir; it fails, leaving s
// empty, unless every program is there.
func loadPinnedPrograms(dir string, s *bpf.CoordinoPrograms) error {
	var loaded []*ebpf.Program
	err := programFields(s, func(name string, field reflect.Value) error {
		p, err := ebpf.LoadPinnedProgram(filepath.Join(dir, name), nil)
		if err != nil {
			return err
		}
		loaded = append(loaded, p)
		field.Set(reflect.ValueOf(p))
		return nil
	})
	if err != nil {
		for _, p := range loaded {
			p.Close()
		}
		*s = bpf.CoordinoPrograms{}
	}
	return err
}

// pinPrograms pins every program of s in dir, replacing what is there.
func pinPrograms(dir string, s *bpf.CoordinoPrograms) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("datapath: create %s: %w", dir, err)
	}
	return programFields(s, func(name string, field reflect.Value) error {
		path := filepath.Join(dir, name)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("datapath: replace program pin %s: %w", path, err)
		}
		if err := field.Interface().(*ebpf.Program).Pin(path); err != nil {
			return fmt.Errorf("datapath: pin program %s: %w", path, err)
		}
		return nil
	})
}

// removeStaleProgramDirs drops the program pins of other fingerprints; a
// program still attached somewhere lives on through its link.
func removeStaleProgramDirs(dir, keep string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if path := filepath.Join(dir, e.Name()); e.IsDir() && strings.HasPrefix(e.Name(), progDirPrefix) && path != keep {
			_ = os.RemoveAll(path)
		}
	}
}
