package daemon

import (
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/coordino/coordino/daemon/masquerade"
)

// chainedNets are the networks of the pods this node serves as a chained
// plugin (another CNI addressed them, so no pod CIDR of Coordino's names
// them): traffic to them stays in the cluster and is never masqueraded,
// or those pods would see the node's address, which their policy lets in.
// Each attachment's networks are counted; the table changes only when a
// network is first held or last let go.
type chainedNets struct {
	byKey map[string][]netip.Prefix // what each attachment holds
	refs  map[netip.Prefix]int
}

// LearnChained takes the networks of a chained attachment's pod (each
// address with the length prevResult gives it), bounded by
// masquerade.ChainedNetwork, and returns once a new one is in the table.
// Learning a key again replaces what it held.
func (m *masq) LearnChained(key string, networks []netip.Prefix) {
	if m == nil || !m.o.Masquerade.Masquerade {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var nodes []netip.Addr // read only for a network not held yet
	var held []netip.Prefix
	for _, p := range networks {
		if n := netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked(); m.chained.refs[n] > 0 {
			held = append(held, n)
			continue
		}
		if nodes == nil {
			nodes = m.nodeAddrsLocked()
		}
		n, narrowed, ok := masquerade.ChainedNetwork(p, nodes)
		if narrowed != nil {
			m.log.Warn("chained network narrowed to the pod's address", zap.String("endpoint", key),
				zap.String("prevResult", p.String()), zap.Bool("added", ok), zap.Error(narrowed))
		}
		if ok {
			held = append(held, n)
		}
	}
	held = slices.Compact(slices.SortedFunc(slices.Values(held), netip.Prefix.Compare))
	if m.chained.byKey == nil {
		m.chained.byKey, m.chained.refs = map[string][]netip.Prefix{}, map[netip.Prefix]int{}
	}
	// The new networks are counted before the old ones are let go, so a
	// network both hold never drops out of the table meanwhile.
	changed := false
	for _, n := range held {
		if m.chained.refs[n]++; m.chained.refs[n] == 1 {
			m.log.Info("chained network kept from the masquerade", zap.String("network", n.String()))
			changed = true
		}
	}
	if m.forgetLocked(key) {
		changed = true
	}
	if len(held) > 0 {
		m.chained.byKey[key] = held
	}
	if changed && !m.waiting {
		m.applyLocked()
	}
}

// ForgetChained lets go of what a chained attachment held.
func (m *masq) ForgetChained(key string) {
	if m == nil || !m.o.Masquerade.Masquerade {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.forgetLocked(key) && !m.waiting {
		m.applyLocked()
	}
}

// forgetLocked drops key's networks; true when one is held no more.
func (m *masq) forgetLocked(key string) (changed bool) {
	for _, n := range m.chained.byKey[key] {
		if m.chained.refs[n]--; m.chained.refs[n] <= 0 {
			delete(m.chained.refs, n)
			m.log.Info("chained network masqueraded again: its last attachment went", zap.String("network", n.String()))
			changed = true
		}
	}
	delete(m.chained.byKey, key)
	return changed
}

// networks are the held networks, sorted.
func (c *chainedNets) networks() []netip.Prefix {
	return slices.SortedFunc(func(yield func(netip.Prefix) bool) {
		for n := range c.refs {
			if !yield(n) {
				return
			}
		}
	}, netip.Prefix.Compare)
}

// nodeAddrsLocked are the addresses a chained network may not hold: every
// node's, as the peer set has them, and this node's on the interfaces its
// default routes leave by (the underlay, which the peer set may lack in
// standalone mode). Callers hold mu.
func (m *masq) nodeAddrsLocked() []netip.Addr {
	out := []netip.Addr{}
	for _, n := range m.peers {
		out = append(out, n.Addresses...)
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: 254}, netlink.RT_FILTER_TABLE)
	if err != nil {
		m.log.Warn("listing the default routes to bound chained networks", zap.Error(err))
		return out
	}
	var links []int
	for _, r := range routes {
		if r.Dst != nil && !isDefault(r.Dst.Mask) {
			continue
		}
		links = append(links, r.LinkIndex)
		for _, nh := range r.MultiPath {
			links = append(links, nh.LinkIndex)
		}
	}
	slices.Sort(links)
	for _, idx := range slices.Compact(links) {
		link, err := netlink.LinkByIndex(idx)
		if err != nil {
			continue
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// isDefault: a route to every address (its mask all zeros).
func isDefault(mask []byte) bool {
	for _, b := range mask {
		if b != 0 {
			return false
		}
	}
	return true
}
