package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/testbed"
)

// Footprint is what a node holds of pod networking and of its CNIs, one
// line per fact, sorted: its links (with type), the tcx programs and tc
// filters on them, its CNI configs (with a hash of their content) and
// plugins, every file under Coordino's run and state dirs and under
// /var/lib/cni (host-local leases, runtime result caches), every BPF pin,
// and the entry count of Coordino's pinned endpoint and ipcache maps.
// Comparing two footprints shows what a run leaked or an uninstall left.
type Footprint []string

// Diff lists the lines only in f ("- ") or only in after ("+ ").
func (f Footprint) Diff(after Footprint) []string {
	return diffSets(f, after)
}

func diffSets(before, after []string) []string {
	in := func(s []string) map[string]bool {
		m := map[string]bool{}
		for _, l := range s {
			m[l] = true
		}
		return m
	}
	b, a := in(before), in(after)
	var out []string
	for l := range b {
		if !a[l] {
			out = append(out, "- "+l)
		}
	}
	for l := range a {
		if !b[l] {
			out = append(out, "+ "+l)
		}
	}
	sort.Strings(out)
	return out
}

// countedMaps are Coordino's pinned maps with one entry per local or remote
// pod address.
var countedMaps = []string{"cdo_endpoints", "cdo_ipcache"}

// NodeFootprint reads a worker's footprint from the host: its network
// namespace, its per-node directories, and its private bpffs through its
// holder's root.
func (c *Cluster) NodeFootprint(node string) (Footprint, error) {
	var m *machine
	for _, w := range c.workers {
		if w.name == node {
			m = w
		}
	}
	if m == nil {
		return nil, fmt.Errorf("no worker %q", node)
	}
	var out []string
	if err := inNetns(m.ns, func() error {
		lines, err := linkFootprint()
		out = append(out, lines...)
		return err
	}); err != nil {
		return nil, fmt.Errorf("%s links: %w", node, err)
	}
	nfs := c.nodeFS(node)
	for _, d := range []struct {
		nodePath string
		hash     bool
	}{
		{"/etc/cni/net.d", true}, {"/opt/cni/bin", false}, {"/var/lib/cni", false},
		{"/run/coordino", false}, {"/var/lib/coordino", false},
	} {
		lines, err := fileFootprint(nfs(d.nodePath), d.nodePath, d.hash)
		if err != nil {
			return nil, err
		}
		out = append(out, lines...)
	}
	bpffs := fmt.Sprintf("/proc/%d/root/sys/fs/bpf", m.holderPid)
	lines, err := fileFootprint(bpffs, "/sys/fs/bpf", false)
	if err != nil {
		return nil, err
	}
	out = append(out, lines...)
	for _, name := range countedMaps {
		n, err := harness.PinnedMapEntries(filepath.Join(bpffs, "coordino", name))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, fmt.Sprintf("bpf map %s: %d entries", name, n))
	}
	sort.Strings(out)
	return out, nil
}

// linkFootprint lists the calling thread's network namespace's links with
// their tcx programs and tc filters.
func linkFootprint() ([]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range links {
		a := l.Attrs()
		out = append(out, fmt.Sprintf("link %s (%s)", a.Name, l.Type()))
		for _, dir := range []struct {
			name   string
			attach ebpf.AttachType
		}{{"ingress", ebpf.AttachTCXIngress}, {"egress", ebpf.AttachTCXEgress}} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: a.Index, Attach: dir.attach})
			if err != nil {
				continue // no tcx on this kernel or link type
			}
			if n := len(res.Programs); n > 0 {
				out = append(out, fmt.Sprintf("tcx %s %s: %d programs", a.Name, dir.name, n))
			}
		}
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			filters, err := netlink.FilterList(l, parent)
			if err != nil {
				continue
			}
			for _, f := range filters {
				name := f.Type()
				if bf, ok := f.(*netlink.BpfFilter); ok {
					name += " " + bf.Name
				}
				out = append(out, fmt.Sprintf("tc filter %s %x: %s", a.Name, parent, name))
			}
		}
	}
	return out, nil
}

// fileFootprint lists every file under root as it is named on the node
// (below nodePath), with a content hash when hash is set.
func fileFootprint(root, nodePath string, hash bool) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		name := filepath.Join(nodePath, rel)
		if d.IsDir() {
			out = append(out, "dir "+name)
			return nil
		}
		line := "file " + name
		if hash && d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(b)
			line += " " + hex.EncodeToString(sum[:6])
		}
		out = append(out, line)
		return nil
	})
	return out, err
}

// SettledFootprints waits until no worker's footprint changes for a few
// seconds (pods deleted through the API are torn down by their kubelet
// afterwards) and returns them by node.
func (c *Cluster) SettledFootprints(ctx context.Context, timeout time.Duration) (map[string]Footprint, error) {
	var last map[string]Footprint
	err := testbed.WaitFor(ctx, "node footprints settled", timeout, func() error {
		now := map[string]Footprint{}
		changed := last == nil
		for _, n := range c.Nodes {
			fp, err := c.NodeFootprint(n)
			if err != nil {
				return err
			}
			now[n] = fp
			if last != nil && len(last[n].Diff(fp)) > 0 {
				changed = true
			}
		}
		last = now
		if changed {
			time.Sleep(3 * time.Second)
			return errors.New("footprints still changing")
		}
		return nil
	})
	return last, err
}
