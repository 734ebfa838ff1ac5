package peers

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Node is one node of the cluster as seen by the cross-node datapath.
type Node struct {
	// Name is the node's name (NodeConfig name in Kubernetes mode).
	Name string
	// Addresses are the underlay addresses other nodes reach it on, at most
	// one per family (status.addresses of its NodeConfig).
	Addresses []netip.Addr
	// Blocks are the pod CIDRs hosted on the node (spec.blocks).
	Blocks []netip.Prefix
	// WireGuard is nil until the node has published its key (status.wireGuard).
	WireGuard *WireGuard
}

// WireGuard is a node's published WireGuard identity.
type WireGuard struct {
	// PublicKey is the base64 Curve25519 public key.
	PublicKey string
	// Endpoint is where its device listens; zero means "its address of the
	// preferred family, default port".
	Endpoint netip.AddrPort
}

// Address returns the node's address of the family of want (v6 when v6).
func (n *Node) Address(v6 bool) (netip.Addr, bool) {
	for _, a := range n.Addresses {
		if a.Is6() == v6 {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// Equal reports whether two descriptions are identical, so consumers leave
// unchanged peers untouched.
func (n *Node) Equal(o *Node) bool {
	if n.Name != o.Name || !slices.Equal(n.Addresses, o.Addresses) || !slices.Equal(n.Blocks, o.Blocks) {
		return false
	}
	if (n.WireGuard == nil) != (o.WireGuard == nil) {
		return false
	}
	return n.WireGuard == nil || *n.WireGuard == *o.WireGuard
}

// Set is the complete set of nodes, keyed by name.
type Set map[string]*Node

// Validate checks a set as a whole: names, one address per family, and no
// block hosted twice (a route cannot point at two nodes).
func (s Set) Validate() error {
	owner := map[netip.Prefix]string{}
	for name, n := range s {
		if n.Name != name {
			return fmt.Errorf("node %q filed under %q", n.Name, name)
		}
		if err := n.validate(); err != nil {
			return err
		}
		for _, b := range n.Blocks {
			if other, dup := owner[b]; dup {
				return fmt.Errorf("node %q: block %s is also hosted by node %q", n.Name, b, other)
			}
			owner[b] = n.Name
		}
	}
	// Overlapping (not only identical) blocks would make routing ambiguous.
	all := make([]netip.Prefix, 0, len(owner))
	for b := range owner {
		all = append(all, b)
	}
	slices.SortFunc(all, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	for i := range all {
		for j := i + 1; j < len(all); j++ {
			if all[i].Overlaps(all[j]) {
				return fmt.Errorf("blocks %s (node %q) and %s (node %q) overlap", all[i], owner[all[i]], all[j], owner[all[j]])
			}
		}
	}
	return nil
}

func (n *Node) validate() error {
	if n.Name == "" || len(n.Name) > 253 || strings.ContainsAny(n.Name, " /\x00") {
		return fmt.Errorf("node name %q: want a non-empty DNS-like name", n.Name)
	}
	var v4, v6 int
	for _, a := range n.Addresses {
		if !a.IsValid() || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || a.IsLoopback() || a.IsLinkLocalUnicast() {
			return fmt.Errorf("node %q: address %v is not a routable unicast address", n.Name, a)
		}
		if a.Is4In6() {
			return fmt.Errorf("node %q: address %v: write IPv4 addresses in dotted form", n.Name, a)
		}
		if a.Is4() {
			v4++
		} else {
			v6++
		}
	}
	if v4 > 1 || v6 > 1 {
		return fmt.Errorf("node %q: addresses: at most one IPv4 and one IPv6 address", n.Name)
	}
	for _, b := range n.Blocks {
		if !b.IsValid() || b != b.Masked() {
			return fmt.Errorf("node %q: block %v is not a masked CIDR", n.Name, b)
		}
		if b.Bits() == 0 {
			return fmt.Errorf("node %q: block %v would route everything to one node", n.Name, b)
		}
	}
	if wg := n.WireGuard; wg != nil {
		if k, err := wgtypes.ParseKey(wg.PublicKey); err != nil {
			return fmt.Errorf("node %q: wireGuard.publicKey: %w", n.Name, err)
		} else if k == (wgtypes.Key{}) {
			return fmt.Errorf("node %q: wireGuard.publicKey: all-zero key", n.Name)
		}
		if wg.Endpoint.IsValid() && wg.Endpoint.Port() == 0 {
			return fmt.Errorf("node %q: wireGuard.endpoint %v: port 0", n.Name, wg.Endpoint)
		}
	}
	return nil
}

// Names returns the node names in sorted order.
func (s Set) Names() []string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
