package routing

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/peers"
)

// Router programs routes (and, in vxlan mode, the VXLAN device with its FDB
// and neighbour entries) from peer sets. Apply computes the full desired
// state and changes only what differs, so a peer joining, leaving or
// changing never touches the entries of the others.
type Router struct {
	cfg Config
	log *zap.Logger
	mu  sync.Mutex
}

// New returns a Router; nothing is programmed before the first Apply, which
// is also the start-up reconcile.
func New(cfg Config, log *zap.Logger) (*Router, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Router{cfg: cfg, log: log}, nil
}

// desired is the kernel state for one peer set.
type desired struct {
	routes []netlink.Route
	fdb    []netlink.Neigh
	neighs []netlink.Neigh
}

// Apply makes the kernel match set (this node's own entry is skipped).
// Errors of one peer do not stop the others; they are joined.
func (r *Router) Apply(set peers.Set) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	var d desired
	vxlanIndex := 0
	switch {
	case r.cfg.Device != "":
		l, err := netlink.LinkByName(r.cfg.Device)
		if err != nil {
			return fmt.Errorf("route via %s: %w", r.cfg.Device, err)
		}
		d = r.deviceState(set, l.Attrs().Index)
	case r.cfg.Mode == VXLAN:
		l, err := r.ensureVXLAN(set[r.cfg.Self])
		if err != nil {
			return err
		}
		vxlanIndex = l.Attrs().Index
		d, errs = r.vxlanState(set, l.Attrs().Index)
	default:
		d, errs = r.directState(set)
	}
	if vxlanIndex == 0 {
		if err := r.removeVXLAN(); err != nil {
			errs = append(errs, err)
		}
	}
	// Next hops first, routes second, stale next hops last: a route never
	// points at a missing neighbour.
	for _, n := range append(d.fdb, d.neighs...) {
		if err := netlink.NeighSet(&n); err != nil {
			errs = append(errs, fmt.Errorf("set neighbour %v %v: %w", n.IP, n.HardwareAddr, err))
		}
	}
	errs = append(errs, SyncTable(unix.RT_TABLE_MAIN, d.routes, r.log)...)
	if vxlanIndex != 0 {
		errs = append(errs, pruneNeighbours(vxlanIndex, d)...)
	}
	return errors.Join(errs...)
}

func (r *Router) peersOf(set peers.Set) []*peers.Node {
	var out []*peers.Node
	for _, name := range set.Names() {
		if name != r.cfg.Self {
			out = append(out, set[name])
		}
	}
	return out
}

func (r *Router) deviceState(set peers.Set, index int) desired {
	var d desired
	for _, p := range r.peersOf(set) {
		for _, b := range p.Blocks {
			d.routes = append(d.routes, netlink.Route{Dst: ipNet(b), LinkIndex: index, Scope: netlink.SCOPE_LINK, Protocol: RouteProtocol})
		}
	}
	return d
}

func (r *Router) directState(set peers.Set) (desired, []error) {
	var d desired
	var errs []error
	for _, p := range r.peersOf(set) {
		for _, b := range p.Blocks {
			rt := netlink.Route{Dst: ipNet(b)}
			if gw, ok := p.Address(b.Addr().Is6()); ok {
				rt.Gw = gw.AsSlice()
			} else if gw6, ok := p.Address(true); ok && b.Addr().Is4() {
				// IPv4 over an IPv6-only underlay: an IPv6 next hop (RTA_VIA).
				rt.Via = &netlink.Via{AddrFamily: netlink.FAMILY_V6, Addr: gw6.AsSlice()}
			} else {
				errs = append(errs, fmt.Errorf("node %q: no %s address to route block %s via", p.Name, family(b.Addr()), b))
				continue
			}
			d.routes = append(d.routes, rt)
		}
	}
	return d, errs
}

// vxlanState routes every block of a peer, both families, via its VTEP's
// IPv6 link-local address (IPv4 through RTA_VIA), so the inner families do
// not depend on the underlay's; one neighbour and one FDB entry per peer.
func (r *Router) vxlanState(set peers.Set, index int) (desired, []error) {
	var d desired
	var errs []error
	underlayV6 := UnderlayIsV6(set[r.cfg.Self])
	for _, p := range r.peersOf(set) {
		vtep, ok := VTEPOf(p, underlayV6)
		if !ok {
			errs = append(errs, fmt.Errorf("node %q: no %s address for the VXLAN underlay", p.Name, underlayFamily(underlayV6)))
			continue
		}
		ll := vtepLinkLocal(vtep.MAC)
		d.fdb = append(d.fdb, netlink.Neigh{LinkIndex: index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF, IP: vtep.Addr.AsSlice(), HardwareAddr: vtep.MAC})
		d.neighs = append(d.neighs, netlink.Neigh{LinkIndex: index, Family: netlink.FAMILY_V6, State: netlink.NUD_PERMANENT, IP: ll.AsSlice(), HardwareAddr: vtep.MAC})
		for _, b := range p.Blocks {
			rt := netlink.Route{Dst: ipNet(b), LinkIndex: index}
			if b.Addr().Is6() {
				rt.Gw = ll.AsSlice()
			} else {
				rt.Via = &netlink.Via{AddrFamily: netlink.FAMILY_V6, Addr: ll.AsSlice()}
			}
			d.routes = append(d.routes, rt)
		}
	}
	return d, errs
}

// ensureVXLAN creates the device or adopts the one a previous run left,
// re-creating it only when its identity (VNI, port, source) changed.
func (r *Router) ensureVXLAN(self *peers.Node) (netlink.Link, error) {
	var src net.IP
	if self != nil {
		if a, ok := self.Address(UnderlayIsV6(self)); ok {
			src = a.AsSlice()
		}
	}
	mtu := r.cfg.UnderlayMTU - PodMTUOverhead(VXLAN, false, UnderlayIsV6(self))
	mac := vtepMAC(r.cfg.Self)
	if l, err := netlink.LinkByName(r.cfg.VXLANDevice); err == nil {
		v, ok := l.(*netlink.Vxlan)
		if ok && v.VxlanId == r.cfg.VNI && v.Port == r.cfg.VXLANPort && v.SrcAddr.Equal(src) && !v.Learning {
			if v.MTU != mtu {
				if err := netlink.LinkSetMTU(l, mtu); err != nil {
					return nil, fmt.Errorf("set MTU of %s: %w", r.cfg.VXLANDevice, err)
				}
			}
			if v.HardwareAddr.String() != mac.String() {
				if err := netlink.LinkSetHardwareAddr(l, mac); err != nil {
					return nil, fmt.Errorf("set MAC of %s: %w", r.cfg.VXLANDevice, err)
				}
			}
			return l, netlink.LinkSetUp(l)
		}
		r.log.Info("re-creating VXLAN device with new parameters", zap.String("device", r.cfg.VXLANDevice))
		if err := netlink.LinkDel(l); err != nil {
			return nil, fmt.Errorf("delete %s: %w", r.cfg.VXLANDevice, err)
		}
	}
	v := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: r.cfg.VXLANDevice, MTU: mtu, HardwareAddr: mac},
		VxlanId:   r.cfg.VNI, Port: r.cfg.VXLANPort, SrcAddr: src, Learning: false,
	}
	if err := netlink.LinkAdd(v); err != nil {
		return nil, fmt.Errorf("create VXLAN device %s: %w", r.cfg.VXLANDevice, err)
	}
	l, err := netlink.LinkByName(r.cfg.VXLANDevice)
	if err != nil {
		return nil, err
	}
	r.log.Info("VXLAN device created", zap.String("device", r.cfg.VXLANDevice), zap.Int("vni", r.cfg.VNI), zap.Int("mtu", mtu))
	return l, netlink.LinkSetUp(l)
}

// removeVXLAN deletes the VXLAN device of a previous run in another mode.
func (r *Router) removeVXLAN() error {
	l, err := netlink.LinkByName(r.cfg.VXLANDevice)
	if err != nil {
		return nil
	}
	if _, ok := l.(*netlink.Vxlan); !ok {
		return nil
	}
	r.log.Info("removing VXLAN device of a previous run", zap.String("device", r.cfg.VXLANDevice))
	return netlink.LinkDel(l)
}

// SyncTable makes the routes carrying RouteProtocol in table exactly want
// (their Table and Protocol are set here), touching only those that differ.
func SyncTable(table int, want []netlink.Route, log *zap.Logger) []error {
	return SyncProtocol(table, RouteProtocol, want, true, log)
}

// SyncProtocol makes the routes carrying proto in table match want (their
// Table and Protocol are set here), touching only those that differ; routes
// of proto that want does not list are removed only when prune is set.
func SyncProtocol(table int, proto netlink.RouteProtocol, want []netlink.Route, prune bool, log *zap.Logger) []error {
	have, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: proto, Table: table}, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return []error{fmt.Errorf("list routes: %w", err)}
	}
	byDst := map[string]netlink.Route{}
	for _, h := range have {
		if h.Dst != nil {
			byDst[h.Dst.String()] = h
		}
	}
	var errs []error
	wanted := map[string]bool{}
	for _, w := range want {
		w.Table, w.Protocol = table, proto
		key := w.Dst.String()
		wanted[key] = true
		h, ok := byDst[key]
		if ok && sameRoute(h, w) {
			continue
		}
		if err := netlink.RouteReplace(&w); err != nil {
			errs = append(errs, fmt.Errorf("route %s: %w", key, err))
			continue
		}
		if ok && w.Priority != 0 && h.Priority != w.Priority {
			// A replace matches on the metric too: the route of another
			// metric is still there beside the new one.
			if err := netlink.RouteDel(&h); err != nil {
				errs = append(errs, fmt.Errorf("delete route %s of metric %d: %w", key, h.Priority, err))
			}
		}
		log.Debug("route set", zap.String("dst", key), zap.Stringer("gw", w.Gw), zap.Any("via", w.Via), zap.Int("link", w.LinkIndex))
	}
	for key, h := range byDst {
		if wanted[key] || !prune {
			continue
		}
		if err := netlink.RouteDel(&h); err != nil {
			errs = append(errs, fmt.Errorf("delete stale route %s: %w", key, err))
			continue
		}
		log.Debug("stale route removed", zap.String("dst", key))
	}
	return errs
}

// sameRoute compares what w sets: a zero type or metric in w is the
// kernel's default, whatever it reads back as.
func sameRoute(h, w netlink.Route) bool {
	if !h.Gw.Equal(w.Gw) || (w.LinkIndex != 0 && h.LinkIndex != w.LinkIndex) {
		return false
	}
	if (w.Type != 0 && h.Type != w.Type) || (w.Priority != 0 && h.Priority != w.Priority) {
		return false
	}
	if (h.Via == nil) != (w.Via == nil) || (w.Via != nil && !w.Via.Equal(h.Via)) {
		return false
	}
	return h.Flags&int(netlink.FLAG_ONLINK) == w.Flags&int(netlink.FLAG_ONLINK)
}

// pruneNeighbours removes permanent entries on the VXLAN device that no
// peer needs any more (peers that left, or changed address).
func pruneNeighbours(index int, d desired) []error {
	keep := map[string]bool{}
	for _, n := range append(d.fdb, d.neighs...) {
		keep[neighKey(n)] = true
	}
	var errs []error
	for _, fam := range []int{unix.AF_BRIDGE, netlink.FAMILY_V4, netlink.FAMILY_V6} {
		list, err := netlink.NeighList(index, fam)
		if err != nil {
			errs = append(errs, fmt.Errorf("list neighbours: %w", err))
			continue
		}
		for _, n := range list {
			if n.State&netlink.NUD_PERMANENT == 0 || keep[neighKey(n)] {
				continue
			}
			if fam == unix.AF_BRIDGE {
				n.Flags |= netlink.NTF_SELF
			}
			if err := netlink.NeighDel(&n); err != nil {
				errs = append(errs, fmt.Errorf("delete stale neighbour %v %v: %w", n.IP, n.HardwareAddr, err))
			}
		}
	}
	return errs
}

func neighKey(n netlink.Neigh) string {
	fam := n.Family
	if fam != unix.AF_BRIDGE {
		fam = 0
	}
	return fmt.Sprintf("%d/%v/%v", fam, n.IP, n.HardwareAddr)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func underlayFamily(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

func family(a netip.Addr) string {
	if a.Is6() {
		return "IPv6"
	}
	return "IPv4"
}
