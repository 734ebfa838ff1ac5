package datapath

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
	"golang.org/x/sys/unix"
)

// Endpoint records live in a userspace-only pinned hash map next to the
// datapath maps, so they share the pins' lifetime: a restart finds exactly
// the endpoints whose programs are still attached, and a reboot clears both.
const (
	stateMapName   = "cdo_ep_state"
	stateKeySize   = 256
	stateValueSize = 16384
	maxEndpoints   = 65536
)

// Attach modes recorded per endpoint.
const (
	modeTCX    = string(AttachTCX)
	modeLegacy = string(AttachTC)
)

// record is the persisted state of one attached endpoint.
type record struct {
	Key         string            `json:"key"`
	HostIfName  string            `json:"hostIfName,omitempty"`
	HostIfIndex int               `json:"hostIfIndex"`
	IPs         []netip.Addr      `json:"ips"`
	Namespace   string            `json:"namespace"`
	Labels      map[string]string `json:"labels,omitempty"`
	Identity    identity.ID       `json:"identity"`
	Mode        string            `json:"mode"`
	// Pod and the named ports last set for it (SetPodNamedPorts).
	Pod        string             `json:"pod,omitempty"`
	NamedPorts []policy.NamedPort `json:"namedPorts,omitempty"`
	// HostMAC and PodMAC of a primary-mode veth pair (host routing).
	HostMAC string `json:"hostMAC,omitempty"`
	PodMAC  string `json:"podMAC,omitempty"`
}

func openStateMap(dir string) (*ebpf.Map, error) {
	m, err := openUserspaceMap(dir, stateMapName, stateKeySize, stateValueSize, maxEndpoints)
	if err != nil {
		return nil, fmt.Errorf("datapath: open endpoint state map: %w", err)
	}
	return m, nil
}

// openUserspaceMap creates or adopts a pinned hash map no program uses:
// state that lives exactly as long as the datapath's pins.
func openUserspaceMap(dir, name string, keySize, valueSize, maxEntries uint32) (*ebpf.Map, error) {
	return ebpf.NewMapWithOptions(&ebpf.MapSpec{
		Name:       name,
		Type:       ebpf.Hash,
		KeySize:    keySize,
		ValueSize:  valueSize,
		MaxEntries: maxEntries,
		Flags:      unix.BPF_F_NO_PREALLOC,
		Pinning:    ebpf.PinByName,
	}, ebpf.MapOptions{PinPath: dir})
}

func stateKey(key string) ([stateKeySize]byte, error) {
	var k [stateKeySize]byte
	if key == "" || len(key) > stateKeySize {
		return k, fmt.Errorf("endpoint key %q: must be 1-%d bytes", key, stateKeySize)
	}
	copy(k[:], key)
	return k, nil
}

func putRecord(m *ebpf.Map, r *record) error {
	k, err := stateKey(r.Key)
	if err != nil {
		return err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if len(data)+4 > stateValueSize {
		return fmt.Errorf("endpoint %q: state of %d bytes exceeds %d (too many labels)", r.Key, len(data), stateValueSize-4)
	}
	v := stateValues.Get().(*[stateValueSize]byte)
	binary.LittleEndian.PutUint32(v[:], uint32(len(data)))
	copy(v[4:], data)
	err = m.Update(k, v[:], ebpf.UpdateAny)
	clear(v[:4+len(data)]) // pooled values stay zeroed past what is written
	stateValues.Put(v)
	if err != nil {
		return fmt.Errorf("endpoint %q: store state: %w", r.Key, err)
	}
	return nil
}

// stateValues recycles the fixed-size map values: a fresh 16 KiB per write
// was most of what an ADD allocated in the daemon, and so of its GC work.
var stateValues = sync.Pool{New: func() any { return new([stateValueSize]byte) }}

func deleteRecord(m *ebpf.Map, key string) error {
	k, err := stateKey(key)
	if err != nil {
		return err
	}
	if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("endpoint %q: delete state: %w", key, err)
	}
	return nil
}

func loadRecords(m *ebpf.Map) ([]*record, error) {
	var (
		k   [stateKeySize]byte
		v   = make([]byte, stateValueSize)
		out []*record
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		n := binary.LittleEndian.Uint32(v)
		if n > stateValueSize-4 {
			return nil, fmt.Errorf("datapath: corrupt endpoint state (length %d)", n)
		}
		r := &record{}
		if err := json.Unmarshal(v[4:4+n], r); err != nil {
			return nil, fmt.Errorf("datapath: corrupt endpoint state: %w", err)
		}
		out = append(out, r)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("datapath: read endpoint state: %w", err)
	}
	return out, nil
}
