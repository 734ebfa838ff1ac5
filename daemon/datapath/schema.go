package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/coordino/coordino/internal/schema"
)

// PinFormat is the layout of the pins under BPFDir: the maps, the endpoint
// records and the links. Version 1 (unstamped) is that of the releases
// before stamps; version 2 adds the stamp's map, which version 1 ignores.
// A change that an older daemon would misread (a map's key or value
// layout, a record's meaning) raises MinReader with Current.
var PinFormat = schema.Format{What: "pinned BPF state", Current: 2, MinReader: 1}

// schemaMapName is the pinned map holding PinFormat's stamp (a bpffs holds
// only pins, no files): key 0, value version and min reader, little endian.
// Its layout never changes: every version must be able to read it.
const schemaMapName = "cdo_schema"

// checkPinSchema reads the stamp of the pins in dir before Open touches
// any of them: pins too new for this build are refused and left as they
// are, so the programs attached keep enforcing the policy in their maps.
func checkPinSchema(dir string) (schema.Decision, error) {
	found, err := readPinSchema(dir)
	if err != nil {
		return 0, err
	}
	return PinFormat.Check(dir, found)
}

// CheckPinSchema reads, without changing anything, the stamp of the pins
// in dir and fails with a *schema.TooNewError when this build cannot read
// them. The daemon calls it before it touches any state; Open checks too.
func CheckPinSchema(dir string) error {
	_, err := checkPinSchema(dir)
	return err
}

// readPinSchema returns the stamp in dir: the zero Stamp for pins written
// before stamps, PinFormat's for a dir without pins.
func readPinSchema(dir string) (schema.Stamp, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, schemaMapName), &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return schema.Stamp{}, fmt.Errorf("datapath: list pins in %s: %w", dir, err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "cdo_") {
				return schema.Stamp{}, nil // unstamped pins
			}
		}
		return PinFormat.Stamp(), nil
	}
	if err != nil {
		return schema.Stamp{}, fmt.Errorf("datapath: open schema stamp %s: %w", filepath.Join(dir, schemaMapName), err)
	}
	defer m.Close()
	var v [8]byte
	if err := m.Lookup(uint32(0), &v); err != nil {
		return schema.Stamp{}, fmt.Errorf("datapath: read schema stamp in %s: %w", dir, err)
	}
	return schema.Stamp{Version: binary.LittleEndian.Uint32(v[:4]), MinReader: binary.LittleEndian.Uint32(v[4:])}, nil
}

// writePinSchema records PinFormat's stamp in dir, once the pins have
// this build's layout.
func writePinSchema(dir string) error {
	m, err := openUserspaceMap(dir, schemaMapName, 4, 8, 1)
	if err != nil {
		return fmt.Errorf("datapath: open schema stamp in %s: %w", dir, err)
	}
	defer m.Close()
	var v [8]byte
	binary.LittleEndian.PutUint32(v[:4], PinFormat.Current)
	binary.LittleEndian.PutUint32(v[4:], PinFormat.MinReader)
	if err := m.Update(uint32(0), v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("datapath: write schema stamp in %s: %w", dir, err)
	}
	return nil
}
