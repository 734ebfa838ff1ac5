package skew

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	bolt "go.etcd.io/bbolt"

	"github.com/coordino/coordino/internal/schema"
)

// setStoreStamp writes st as the endpoint store's stamp, as a daemon of
// another version would have; the daemon must be stopped.
func setStoreStamp(t *testing.T, stateDir string, st schema.Stamp) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(stateDir, "endpoints.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	data, _ := json.Marshal(st)
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("meta"))
		if err != nil {
			return err
		}
		return b.Put([]byte("schema"), data)
	}); err != nil {
		t.Fatal(err)
	}
}

// setPinStamp writes st into the pins' stamp map.
func setPinStamp(t *testing.T, bpfDir string, st schema.Stamp) {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpfDir, "cdo_schema"), nil)
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

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestDaemonRefusesNewerState starts this tree's daemon on state stamped
// by a later, incompatible version, as a rollback past a breaking change
// would: the daemon exits naming the versions, before it touches the
// store or any pin, and the pods' connection keeps working on the
// programs and policy in force. With the state readable again it adopts
// everything.
func TestDaemonRefusesNewerState(t *testing.T) {
	_, cur := builds(t)
	n := newNode(t, []string{"10.142.0.0/24"}, cur.daemon)
	c := newCNI(t, n, cur)
	a := addPod(t, c, "a")
	b := addPod(t, c, "b")
	conn := openEcho(t, a, b, 7000)
	if err := n.StopDaemon(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	dbPath := filepath.Join(n.StateDir, "endpoints.db")
	newer := schema.Stamp{Version: 40, MinReader: 40}
	for _, tc := range []struct {
		what string
		set  func(schema.Stamp)
		want string
	}{
		{"store", func(st schema.Stamp) { setStoreStamp(t, n.StateDir, st) },
			`endpoint store ` + dbPath + ` has schema version 40, readable by version 40 and later; this build reads versions up to 2`},
		{"pins", func(st schema.Stamp) { setPinStamp(t, n.BPFDir, st) },
			`pinned BPF state ` + n.BPFDir + ` has schema version 40, readable by version 40 and later; this build reads versions up to 2`},
	} {
		tc.set(newer)
		store, _ := os.ReadFile(dbPath)
		pins := dirNames(t, n.BPFDir)
		links := dirNames(t, filepath.Join(n.BPFDir, "links"))
		if err := n.StartDaemon(); err == nil {
			t.Fatalf("%s too new: the daemon started", tc.what)
		}
		if !n.LogContains(tc.want) {
			t.Fatalf("%s too new: the log does not say %q:\n%s", tc.what, tc.want, n.LogTail(10))
		}
		if after, _ := os.ReadFile(dbPath); !bytes.Equal(store, after) {
			t.Errorf("%s too new: the refusing daemon changed the store", tc.what)
		}
		if after := dirNames(t, n.BPFDir); !slices.Equal(pins, after) {
			t.Errorf("%s too new: pins %v became %v", tc.what, pins, after)
		}
		if after := dirNames(t, filepath.Join(n.BPFDir, "links")); !slices.Equal(links, after) {
			t.Errorf("%s too new: links %v became %v", tc.what, links, after)
		}
		if err := conn.roundTrip(); err != nil {
			t.Fatalf("%s too new, daemon refused: %v", tc.what, err)
		}
		tc.set(schema.Stamp{Version: 2, MinReader: 1})
	}
	if err := n.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*pod{a, b} {
		if err := c.Check(ctx(t), p.rt); err != nil {
			t.Fatalf("CHECK %s after the refusals: %v", p.Name, err)
		}
		if err := c.Del(ctx(t), p.rt); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Leaks(0); err != nil {
		t.Fatal(err)
	}
}
