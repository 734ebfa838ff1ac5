package main

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/test/harness"
)

// state is what a pod leaves on the node.
type state map[string]int

// bpfMaps are the pinned maps that hold per-pod entries (cdo_ct_purge: a
// deleted pod until its conntrack entries are purged; cdo_local_eps: host
// routing's primary endpoints).
var bpfMaps = []string{"cdo_endpoints", "cdo_ipcache", "cdo_policy", "cdo_conntrack", "cdo_ct_purge", "cdo_local_eps"}

func (c *churn) snapshot() (state, error) {
	n := c.node
	st := state{}
	veths, err := n.HostVeths()
	if err != nil {
		return nil, err
	}
	pins, err := n.Pins()
	if err != nil {
		return nil, err
	}
	st["host veths"], st["netns pins"] = len(veths), len(pins)
	for name, labels := range map[string][]string{
		"used addresses":   {"coordino_ipam_addresses", `state="used"`},
		"endpoint records": {"coordino_endpoints", `mode="primary"`},
	} {
		v, err := n.Metric(labels[0], labels[1:]...)
		if err != nil {
			return nil, err
		}
		st[name] = int(v)
	}
	queued, _ := filepath.Glob(filepath.Join(n.RunDir, "delete-queue", "*"))
	st["queued DELs"] = len(queued)
	for _, name := range bpfMaps {
		count, err := harness.PinnedMapEntries(filepath.Join(n.BPFDir, name))
		if err != nil {
			return nil, err
		}
		st["BPF "+name+" entries"] = count
	}
	return st, nil
}

// purgeWait bounds the wait for the daemon's background conntrack purge.
const purgeWait = 30 * time.Second

// waitPurged waits until the daemon reports no removed pod pending a
// conntrack purge: DEL leaves the purge to a background walk (at most a
// second behind), so the checks below look at the table once it ran. A
// purge that never completes is an error, not a wait forever.
func (c *churn) waitPurged() error {
	deadline := time.Now().Add(purgeWait)
	for {
		n, err := c.node.Metric("coordino_conntrack_purge_pending")
		if err != nil {
			return fmt.Errorf("read pending conntrack purges: %w", err)
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%v removed pods still pending a conntrack purge after %v", n, purgeWait)
		}
		time.Sleep(200 * time.Millisecond) // each scrape reads the conntrack table
	}
}

// staleConntrack counts conntrack entries that name a pod address other
// than the server's: with every client deleted (and its pending purge
// done), each of them is a leak.
func (c *churn) staleConntrack() (int, error) {
	if err := c.waitPurged(); err != nil {
		return 0, err
	}
	pin := filepath.Join(c.node.BPFDir, "cdo_conntrack")
	m, err := ebpf.LoadPinnedMap(pin, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return 0, fmt.Errorf("open pinned map %s: %w", pin, err)
	}
	defer m.Close()
	pods := netip.MustParsePrefix(podCIDR)
	stale := func(family uint8, raw [16]byte) bool {
		var a netip.Addr
		switch family {
		case 4:
			a = netip.AddrFrom4([4]byte(raw[:4]))
		case 6:
			a = netip.AddrFrom16(raw)
		default:
			return false
		}
		return pods.Contains(a) && a != c.server
	}
	var (
		k bpf.CoordinoCtKey
		v bpf.CoordinoCtEntry
		n int
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if stale(k.Family, k.Src) || stale(k.Family, k.Dst) {
			n++
		}
	}
	return n, it.Err()
}

// leaks compares the node with its state before the first pod.
func (c *churn) leaks(before state) []string {
	if err := c.waitPurged(); err != nil {
		return []string{err.Error()}
	}
	after, err := c.snapshot()
	if err != nil {
		return []string{"inspect node: " + err.Error()}
	}
	out := []string{}
	for k, b := range before {
		if a := after[k]; a != b {
			out = append(out, fmt.Sprintf("%s: %d before the first pod, %d after the last", k, b, a))
		}
	}
	return out
}
