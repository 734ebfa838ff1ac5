package multinode

import (
	"encoding/binary"
	"encoding/json"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/coordino/coordino/bpf"
)

// TestHostRoutingAfterUpgrade: a pod attached by a release that did not
// record its veth's MACs (its datapath record lacks them, so it has no
// host routing entry) is host-routed once a daemon that knows them
// restarts: the reconcile reads the MACs off the host veth and its
// permanent neighbour entry.
func TestHostRoutingAfterUpgrade(t *testing.T) {
	c := newCluster(t, direct, 2)
	a, b := c.addPod(c.nodes[0]), c.addPod(c.nodes[1])
	serveName(t, b)
	n1 := c.nodes[1]
	if err := n1.StopDaemon(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	forgetMACs(t, n1, b)
	c.startDaemon(n1)
	checkRedirected(t, c, a, b)
}

// forgetMACs makes n's pinned datapath state what an older release left for
// p: its record without MACs and no host routing entries.
func forgetMACs(t *testing.T, n *node, p *pod) {
	t.Helper()
	// The datapath's endpoint records: a 4-byte length, then JSON.
	state, err := ebpf.LoadPinnedMap(filepath.Join(n.BPFDir, "cdo_ep_state"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer state.Close()
	var (
		key     [256]byte
		value   = make([]byte, state.ValueSize())
		rewrite = map[[256]byte][]byte{}
	)
	it := state.Iterate()
	for it.Next(&key, &value) {
		var rec map[string]any
		if err := json.Unmarshal(value[4:4+binary.LittleEndian.Uint32(value)], &rec); err != nil {
			t.Fatal(err)
		}
		ips, _ := rec["ips"].([]any)
		if !slices.Contains(ips, any(p.addr(false).String())) {
			continue
		}
		if rec["podMAC"] == nil || rec["hostMAC"] == nil {
			t.Fatalf("the record of %s has no MACs to forget: %v", p.Name, rec)
		}
		delete(rec, "hostMAC")
		delete(rec, "podMAC")
		data, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		v := make([]byte, len(value))
		binary.LittleEndian.PutUint32(v, uint32(len(data)))
		copy(v[4:], data)
		rewrite[key] = v
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rewrite) != 1 {
		t.Fatalf("%d datapath records hold %v, want 1", len(rewrite), p.addr(false))
	}
	for k, v := range rewrite {
		if err := state.Update(k, v, ebpf.UpdateExist); err != nil {
			t.Fatal(err)
		}
	}
	eps, err := ebpf.LoadPinnedMap(filepath.Join(n.BPFDir, bpf.CoordinoMapCdoLocalEps), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer eps.Close()
	var (
		k     bpf.CoordinoLocalEpKey
		v     bpf.CoordinoLocalEp
		local []bpf.CoordinoLocalEpKey
	)
	for it := eps.Iterate(); it.Next(&k, &v); {
		local = append(local, k)
	}
	if len(local) != 2 {
		t.Fatalf("%s has %d host routing entries, want %s's two addresses", n.Name, len(local), p.Name)
	}
	for _, k := range local {
		if err := eps.Delete(&k); err != nil {
			t.Fatal(err)
		}
	}
}
