package nftdp

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/coordino/coordino/daemon/atomicfile"
	"github.com/coordino/coordino/daemon/datapath/dpapi"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// DefaultNamespace is the namespace of endpoints that name none.
const DefaultNamespace = "default"

// recordVersion is the on-disk version of a record; a newer one is refused.
const recordVersion = 1

// record is an attached endpoint as the datapath keeps it: in memory and
// in a file of the state dir, so a restarted daemon knows which chains
// and identities are its own.
type record struct {
	Version     int                `json:"version"`
	Key         string             `json:"key"`
	HostIfName  string             `json:"hostIfName"`
	HostIfIndex int                `json:"hostIfIndex"`
	IPs         []netip.Addr       `json:"ips"`
	Namespace   string             `json:"namespace"`
	Labels      map[string]string  `json:"labels,omitempty"`
	Pod         string             `json:"pod,omitempty"`
	Identity    identity.ID        `json:"identity"`
	NamedPorts  []policy.NamedPort `json:"namedPorts,omitempty"`
	// dying is a detached endpoint whose chains only drop until the sweep
	// removes it (sweep_linux.go); its record file is gone.
	dying bool
}

// maxIfName is the kernel's IFNAMSIZ less the terminating NUL.
const maxIfName = 15

func newRecord(ep dpapi.Endpoint) (*record, error) {
	if ep.Key == "" {
		return nil, errors.New("nftables datapath: endpoint key is empty")
	}
	if ep.HostIfName == "" || len(ep.HostIfName) > maxIfName || strings.ContainsRune(ep.HostIfName, 0) {
		return nil, fmt.Errorf("endpoint %q: invalid host interface name %q", ep.Key, ep.HostIfName)
	}
	r := &record{Version: recordVersion, Key: ep.Key, HostIfName: ep.HostIfName, HostIfIndex: ep.HostIfIndex,
		Namespace: ep.Namespace, Labels: maps.Clone(ep.Labels), Pod: ep.Pod}
	if r.Namespace == "" {
		r.Namespace = DefaultNamespace
	}
	for _, ip := range ep.IPs {
		if !ip.IsValid() {
			return nil, fmt.Errorf("endpoint %q: invalid IP address", ep.Key)
		}
		r.IPs = append(r.IPs, ip.Unmap())
	}
	return r, nil
}

// recordStore keeps one file per endpoint under dir; an empty dir keeps
// nothing (tests, or a daemon that adopts nothing).
type recordStore struct{ dir string }

func (s recordStore) path(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(s.dir, hex.EncodeToString(sum[:16])+".json")
}

func (s recordStore) put(r *record) error {
	if s.dir == "" {
		return nil
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("nftables datapath: create %s: %w", s.dir, err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("nftables datapath: encode endpoint %q: %w", r.Key, err)
	}
	// No fsync: a record describes the table, which a reboot takes away
	// with everything it held; Open drops records the table outlived not.
	if err := atomicfile.WriteVolatile(s.path(r.Key), b, 0o600); err != nil {
		return fmt.Errorf("nftables datapath: save endpoint %q: %w", r.Key, err)
	}
	return nil
}

func (s recordStore) delete(key string) error {
	if s.dir == "" {
		return nil
	}
	if err := os.Remove(s.path(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("nftables datapath: remove endpoint %q's record: %w", key, err)
	}
	return nil
}

// clear removes every record (and any temporary file of an interrupted
// write): what they described is gone.
func (s recordStore) clear() error {
	if s.dir == "" {
		return nil
	}
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("nftables datapath: list endpoint records: %w", err)
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			if err := os.Remove(filepath.Join(s.dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("nftables datapath: remove stale endpoint record: %w", err)
			}
		}
	}
	return nil
}

// load reads every record; a file that does not parse is an error naming
// it, not a silently forgotten endpoint.
func (s recordStore) load() ([]*record, error) {
	if s.dir == "" {
		return nil, nil
	}
	files, err := filepath.Glob(filepath.Join(s.dir, "*.json"))
	if err != nil {
		return nil, err
	}
	var out []*record
	for _, f := range files {
		r, err := parseRecord(f)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func parseRecord(path string) (*record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("nftables datapath: read endpoint record: %w", err)
	}
	return decodeRecord(b, path)
}

// decodeRecord parses one record file's bytes; name names it in errors.
func decodeRecord(b []byte, name string) (*record, error) {
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("nftables datapath: endpoint record %s: %w", name, err)
	}
	switch {
	case r.Version > recordVersion:
		return nil, fmt.Errorf("nftables datapath: endpoint record %s: version %d is newer than this daemon's %d", name, r.Version, recordVersion)
	case r.Key == "":
		return nil, fmt.Errorf("nftables datapath: endpoint record %s: key is empty", name)
	case r.HostIfName == "" || len(r.HostIfName) > maxIfName || strings.ContainsRune(r.HostIfName, 0):
		return nil, fmt.Errorf("nftables datapath: endpoint record %s: invalid hostIfName %q", name, r.HostIfName)
	case r.Identity < identity.FirstPod:
		return nil, fmt.Errorf("nftables datapath: endpoint record %s: identity %d is not a pod identity", name, r.Identity)
	}
	for i, ip := range r.IPs {
		if !ip.IsValid() {
			return nil, fmt.Errorf("nftables datapath: endpoint record %s: ips[%d] is invalid", name, i)
		}
		r.IPs[i] = ip.Unmap()
	}
	return &r, nil
}
