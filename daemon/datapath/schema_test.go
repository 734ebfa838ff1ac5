package datapath

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"go.uber.org/zap/zaptest"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/internal/schema"
	"github.com/coordino/coordino/test/privileged"
)

var schemaPolicyKey = policyKey(policy.Key{Prefix: 32 + 32 + 8 + 8 + 16, Local: 1000, Remote: 1001, Dir: policy.Ingress, Proto: 6, Port: 80})

// pinsWithPolicy opens the datapath in a fresh BPF dir, writes one policy
// entry as a previous run's enforced policy and closes it again.
func pinsWithPolicy(t *testing.T) string {
	t.Helper()
	privileged.Require(t)
	dir := testnet.BPFDir(t)
	dp, err := Open(Config{BPFDir: dir, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.objs.CdoPolicy.Update(schemaPolicyKey, bpf.CoordinoPolicyValue{Flags: 1}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

func setPinSchema(t *testing.T, dir string, st schema.Stamp) {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, schemaMapName), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var v [8]byte
	binary.LittleEndian.PutUint32(v[:4], st.Version)
	binary.LittleEndian.PutUint32(v[4:], st.MinReader)
	if err := m.Update(uint32(0), v, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
}

func pinNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func policyEntryPinned(t *testing.T, dir string) bool {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, bpf.CoordinoMapCdoPolicy), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var v bpf.CoordinoPolicyValue
	return m.Lookup(schemaPolicyKey, &v) == nil && v.Flags == 1
}

// A daemon rolled back below the pins' version refuses them before it
// touches any: no pin removed (not even a retired one), the policy in
// force still in its map, the stamp as the newer daemon left it.
func TestOpenRefusesNewerPins(t *testing.T) {
	dir := pinsWithPolicy(t)
	newer := schema.Stamp{Version: PinFormat.Current + 3, MinReader: PinFormat.Current + 1}
	setPinSchema(t, dir, newer)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Pin(filepath.Join(dir, "cdo_ct_memo")); err != nil {
		t.Fatal(err)
	}
	m.Close()
	before := pinNames(t, dir)

	dp, err := Open(Config{BPFDir: dir, Logger: zaptest.NewLogger(t)})
	if err == nil {
		dp.Close()
		t.Fatal("Open adopted pins it cannot read")
	}
	for _, want := range []string{"pinned BPF state " + dir, "schema version 5", "readable by version 3", "reads versions up to 2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if after := pinNames(t, dir); !slices.Equal(before, after) {
		t.Errorf("pins changed by the refused Open: %v, were %v", after, before)
	}
	if !policyEntryPinned(t, dir) {
		t.Error("the policy in force left its map")
	}
	if st, err := readPinSchema(dir); err != nil || st != newer {
		t.Errorf("stamp after the refused Open = %+v, %v; want %+v", st, err, newer)
	}
}

// Newer pins whose change was additive are adopted, their stamp kept.
func TestOpenReadsNewerAdditivePins(t *testing.T) {
	dir := pinsWithPolicy(t)
	newer := schema.Stamp{Version: PinFormat.Current + 1, MinReader: PinFormat.Current}
	setPinSchema(t, dir, newer)
	dp, err := Open(Config{BPFDir: dir, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	dp.Close()
	if !policyEntryPinned(t, dir) {
		t.Error("the policy in force left its map")
	}
	if st, err := readPinSchema(dir); err != nil || st != newer {
		t.Errorf("stamp = %+v, %v; want the newer %+v kept", st, err, newer)
	}
}

// Pins of a release before stamps are adopted and stamped.
func TestOpenMigratesUnstampedPins(t *testing.T) {
	dir := pinsWithPolicy(t)
	if err := os.Remove(filepath.Join(dir, schemaMapName)); err != nil {
		t.Fatal(err)
	}
	if st, err := readPinSchema(dir); err != nil || st != (schema.Stamp{}) {
		t.Fatalf("unstamped pins read as %+v, %v", st, err)
	}
	dp, err := Open(Config{BPFDir: dir, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	dp.Close()
	if !policyEntryPinned(t, dir) {
		t.Error("the policy in force left its map")
	}
	if st, err := readPinSchema(dir); err != nil || st != PinFormat.Stamp() {
		t.Errorf("stamp after migration = %+v, %v; want %+v", st, err, PinFormat.Stamp())
	}
}
