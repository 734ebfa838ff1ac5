package harness

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"sort"

	"github.com/cilium/ebpf"
)

// Pinned datapath maps the daemon keeps under --bpf-dir: the BPF endpoint
// table (keyed by host ifindex) and the daemon's per-endpoint state records.
const (
	endpointsMapPin = "cdo_endpoints"
	stateMapPin     = "cdo_ep_state"
)

// DatapathEndpoints reads the node's pinned maps: the sorted host ifindexes
// in the BPF endpoint table and the number of endpoint state records.
func (n *Node) DatapathEndpoints() (ifindexes []int, records int, err error) {
	keys, err := pinnedMapKeys(filepath.Join(n.BPFDir, endpointsMapPin))
	if err != nil {
		return nil, 0, err
	}
	for _, k := range keys {
		if len(k) != 4 {
			return nil, 0, fmt.Errorf("%s: key of %d bytes", endpointsMapPin, len(k))
		}
		ifindexes = append(ifindexes, int(binary.NativeEndian.Uint32(k)))
	}
	sort.Ints(ifindexes)
	states, err := pinnedMapKeys(filepath.Join(n.BPFDir, stateMapPin))
	return ifindexes, len(states), err
}

// PinnedMapEntries counts the entries of the BPF map pinned at path.
func PinnedMapEntries(path string) (int, error) {
	keys, err := pinnedMapKeys(path)
	return len(keys), err
}

func pinnedMapKeys(path string) ([][]byte, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, fmt.Errorf("open pinned map %s: %w", path, err)
	}
	defer m.Close()
	var out [][]byte
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, append([]byte(nil), k...))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read pinned map %s: %w", path, err)
	}
	return out, nil
}
