package policy

import (
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Node peers. A ClusterNetworkPolicy's nodes peer selects nodes by their
// labels and matches their addresses: each address's own prefix (/32 or
// /128) becomes a CIDR identity through the same prefix references as an
// ipBlock, so the ipcache resolves a selected node's address to it in the
// CIDR lookup while the address's node identity (node isolation, host
// rules) is left as it is. A node event costs the node peers whose
// selector is filed under the node's old or new labels.

// nodeState is a node's labels and addresses as the engine has them.
type nodeState struct {
	labels labels.Set
	addrs  []netip.Addr
}

// prefixes are the host prefixes of the node's addresses.
func (n *nodeState) prefixes() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(n.addrs))
	for _, a := range n.addrs {
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out
}

// object is the node as a Node object of name (for Compile).
func (n *nodeState) object(name string) *corev1.Node {
	out := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: n.labels}}
	for _, a := range n.addrs {
		out.Status.Addresses = append(out.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
	}
	return out
}

// SetNode sets the labels and addresses of node name (nil addrs and
// labels with gone: the node is deleted). Cost: the node peers filed under
// its old or new labels, and its addresses' prefixes for those that select
// it.
func (e *Engine) SetNode(name string, lbls map[string]string, addrs []netip.Addr) {
	prev := e.nodes[name]
	next := &nodeState{labels: labels.Set(maps.Clone(lbls)), addrs: normalAddrs(addrs)}
	if next.labels == nil {
		next.labels = labels.Set{}
	}
	if prev != nil && maps.Equal(prev.labels, next.labels) && slices.Equal(prev.addrs, next.addrs) {
		return
	}
	affected := map[*peerState]struct{}{}
	collect := func(q *peerState) { affected[q] = struct{}{} }
	if prev != nil {
		e.nodePeers.candidates(prev.labels, collect)
	}
	e.nodePeers.candidates(next.labels, collect)
	e.nodes[name] = next
	for q := range affected {
		e.selectNode(q, name, next)
	}
}

// DeleteNode forgets node name: the peers that selected it stop matching
// its addresses.
func (e *Engine) DeleteNode(name string) {
	prev := e.nodes[name]
	if prev == nil {
		return
	}
	delete(e.nodes, name)
	e.nodePeers.candidates(prev.labels, func(q *peerState) { e.selectNode(q, name, nil) })
}

// normalAddrs sorts and deduplicates addrs, unmapping IPv4-in-IPv6 and
// dropping invalid ones, so equal address sets compare equal.
func normalAddrs(addrs []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a.IsValid() {
			out = append(out, a.Unmap().WithZone(""))
		}
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return slices.Compact(out)
}

// activateNodePeer files node peer q and matches the nodes it selects.
func (e *Engine) activateNodePeer(q *peerState) {
	q.nodes = map[string][]netip.Prefix{}
	q.nodePrefixes = map[netip.Prefix]int{}
	e.nodePeers.add(q.peer.NodeSelector, q)
	for name, n := range e.nodes {
		e.selectNode(q, name, n)
	}
}

// deactivateNodePeer releases what q holds (its matches are already gone).
func (e *Engine) deactivateNodePeer(q *peerState) {
	e.nodePeers.remove(q.peer.NodeSelector, q)
	for p, n := range q.nodePrefixes {
		for range n {
			e.unrefPrefix(p)
		}
	}
	q.nodes, q.nodePrefixes = nil, nil
}

// selectNode makes q match node name's prefixes if its selector matches n
// (nil: the node is gone), and stop matching the ones it held before.
func (e *Engine) selectNode(q *peerState, name string, n *nodeState) {
	var want []netip.Prefix
	if n != nil && q.peer.NodeSelector.Matches(n.labels) {
		want = n.prefixes()
	}
	had := q.nodes[name]
	if slices.Equal(had, want) {
		return
	}
	// New references first, so a prefix kept across the change keeps its
	// identity.
	for _, p := range want {
		if q.nodePrefixes[p]++; q.nodePrefixes[p] == 1 {
			e.refPrefix(p)
			if s := e.prefixes[p]; s != nil {
				e.match(q, s.id)
			}
		}
	}
	for _, p := range had {
		if q.nodePrefixes[p]--; q.nodePrefixes[p] == 0 {
			delete(q.nodePrefixes, p)
			if s := e.prefixes[p]; s != nil {
				e.unmatch(q, s.id)
			}
			e.unrefPrefix(p)
		}
	}
	if want == nil {
		delete(q.nodes, name)
	} else {
		q.nodes[name] = want
	}
}

// NodeAddrs are the addresses of node n a nodes peer matches: its
// InternalIP and ExternalIP addresses (status.addresses); others (host
// names) and unparsable ones are skipped.
func NodeAddrs(n *corev1.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if addr, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, addr)
		}
	}
	return out
}

// nodeOf names a node that has host prefix p as an address (the first by
// name), for explain; it costs one look at every node.
func (e *Engine) nodeOf(p netip.Prefix) (string, bool) {
	if !p.IsSingleIP() {
		return "", false
	}
	var names []string
	for name, n := range e.nodes {
		if slices.Contains(n.addrs, p.Addr()) {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "", false
	}
	return slices.Min(names), true
}
