package peers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"

	"sigs.k8s.io/yaml"
)

// maxFileSize bounds a peers file: 5,000 nodes with keys fit in a few MiB.
const maxFileSize = 16 << 20

// fileFormat is the peers file (YAML or JSON). Field names follow the
// NodeConfig API so one document describes a node in either mode:
//
//	nodes:
//	- name: node-a
//	  addresses: [192.0.2.1, "2001:db8::1"]
//	  blocks: [10.1.0.0/24, "fd00:1::/64"]
//	  wireGuard: {publicKey: "base64…", endpoint: "192.0.2.1:51871"}
type fileFormat struct {
	Nodes []fileNode `json:"nodes"`
}

type fileNode struct {
	Name      string         `json:"name"`
	Addresses []string       `json:"addresses"`
	Blocks    []string       `json:"blocks"`
	WireGuard *fileWireGuard `json:"wireGuard,omitempty"`
}

type fileWireGuard struct {
	PublicKey string `json:"publicKey"`
	Endpoint  string `json:"endpoint,omitempty"`
}

// ParseFile decodes and validates a peers file. Errors name the node and field.
func ParseFile(data []byte) (Set, error) {
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("peers file is %d bytes, limit %d", len(data), maxFileSize)
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("peers file: %w", err)
	}
	var f fileFormat
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("peers file: %w", err)
	}
	set := Set{}
	for i, fn := range f.Nodes {
		n := &Node{Name: fn.Name}
		if _, dup := set[n.Name]; dup {
			return nil, fmt.Errorf("nodes[%d]: node %q listed twice", i, n.Name)
		}
		for _, s := range fn.Addresses {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("nodes[%d] (%q): addresses: %w", i, n.Name, err)
			}
			n.Addresses = append(n.Addresses, a)
		}
		for _, s := range fn.Blocks {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, fmt.Errorf("nodes[%d] (%q): blocks: %w", i, n.Name, err)
			}
			n.Blocks = append(n.Blocks, p)
		}
		if fn.WireGuard != nil {
			n.WireGuard = &WireGuard{PublicKey: fn.WireGuard.PublicKey}
			if fn.WireGuard.Endpoint != "" {
				ep, err := netip.ParseAddrPort(fn.WireGuard.Endpoint)
				if err != nil {
					return nil, fmt.Errorf("nodes[%d] (%q): wireGuard.endpoint: %w", i, n.Name, err)
				}
				n.WireGuard.Endpoint = ep
			}
		}
		set[n.Name] = n
	}
	if err := set.Validate(); err != nil {
		return nil, fmt.Errorf("peers file: %w", err)
	}
	return set, nil
}

// MarshalFile encodes a set in the peers file format (tests and tools write
// the file the operator distributes with it).
func MarshalFile(s Set) ([]byte, error) {
	var f fileFormat
	for _, name := range s.Names() {
		n := s[name]
		fn := fileNode{Name: n.Name, Addresses: []string{}, Blocks: []string{}}
		for _, a := range n.Addresses {
			fn.Addresses = append(fn.Addresses, a.String())
		}
		for _, b := range n.Blocks {
			fn.Blocks = append(fn.Blocks, b.String())
		}
		if n.WireGuard != nil {
			fn.WireGuard = &fileWireGuard{PublicKey: n.WireGuard.PublicKey}
			if n.WireGuard.Endpoint.IsValid() {
				fn.WireGuard.Endpoint = n.WireGuard.Endpoint.String()
			}
		}
		f.Nodes = append(f.Nodes, fn)
	}
	return yaml.Marshal(f)
}
