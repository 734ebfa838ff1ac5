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
// block hosted twice or overlapping another (a route cannot point at two
// nodes).
func (s Set) Validate() error {
	for name, n := range s {
		if n.Name != name {
			return fmt.Errorf("node %q filed under %q", n.Name, name)
		}
		if err := n.validate(); err != nil {
			return err
		}
	}
	if o, ok := s.firstOverlap(); ok {
		return o
	}
	return nil
}

// overlap names two nodes whose blocks overlap.
type overlap struct {
	a, b   string
	pa, pb netip.Prefix
}

func (o overlap) Error() string {
	if o.pa == o.pb {
		return fmt.Sprintf("node %q: block %s is also hosted by node %q", o.b, o.pb, o.a)
	}
	return fmt.Sprintf("blocks %s (node %q) and %s (node %q) overlap", o.pa, o.a, o.pb, o.b)
}

// firstOverlap sorts all blocks by address, then prefix length: prefixes
// either nest or are disjoint, so if any two overlap, two neighbours in
// that order do. O(B log B), which matters at thousands of nodes.
func (s Set) firstOverlap() (overlap, bool) {
	type owned struct {
		p    netip.Prefix
		node string
	}
	var all []owned
	for _, name := range s.Names() {
		for _, b := range s[name].Blocks {
			all = append(all, owned{b, name})
		}
	}
	slices.SortStableFunc(all, func(x, y owned) int {
		if c := x.p.Addr().Compare(y.p.Addr()); c != 0 {
			return c
		}
		return x.p.Bits() - y.p.Bits()
	})
	for i := 1; i < len(all); i++ {
		if all[i-1].p.Overlaps(all[i].p) {
			return overlap{all[i-1].node, all[i].node, all[i-1].p, all[i].p}, true
		}
	}
	return overlap{}, false
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
