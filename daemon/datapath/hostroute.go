package datapath

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/kernel"
)

// eBPF host routing (bpf/lib/hostroute.h): pod-to-pod packets between this
// node's primary endpoints and other nodes' pod blocks skip the host's
// forwarding path. The datapath feeds it three things: the local primary
// endpoints by address (cdo_local_eps, written once an endpoint's programs
// enforce its policy, removed before they go), the other nodes' blocks
// (cdo_peer_blocks, SetPeerBlocks) and the on/off flag (SetHostRouting);
// and it empties the programs' cache of FIB answers (ForgetNextHops).

// hostRouting is host routing's part: the maps the programs' host routing
// and eBPF tunnel read (local endpoints, peer blocks, tunnel peers and
// config, the FIB cache) and what the daemon last wrote to them. The on/off
// flag lives in the config map, written by the map writer. Callers hold
// the datapath's lock.
type hostRouting struct {
	maps     hostRoutingMaps
	features *kernel.Features
	health   *mapHealth
	log      *zap.Logger
	// peerBlocks mirrors cdo_peer_blocks once setPeerBlocks has read it.
	peerBlocks map[bpf.CoordinoIpcacheKey]uint32
	// tunnelPeers mirrors cdo_tunnel_peers once setTunnel has read it;
	// tunnelCfg is what cdo_tunnel holds.
	tunnelPeers map[bpf.CoordinoIpcacheKey]bpf.CoordinoTunnelPeer
	tunnelCfg   bpf.CoordinoTunnelConfig
	// unsupportedSaid: the kernel cannot host-route, and it was said.
	unsupportedSaid bool
}

// hostRoutingMaps are the maps of host routing and the eBPF tunnel.
type hostRoutingMaps struct {
	localEps, peerBlocks, tunnelPeers, tunnel, fibCache, stats *ebpf.Map
}

// newHostRouting adopts the tunnel config a previous daemon left: the
// tunnel and guard stay as they were until the peers and options say
// otherwise.
func newHostRouting(maps hostRoutingMaps, features *kernel.Features, health *mapHealth, log *zap.Logger) (*hostRouting, error) {
	h := &hostRouting{maps: maps, features: features, health: health, log: log}
	if err := maps.tunnel.Lookup(uint32(0), &h.tunnelCfg); err != nil {
		return nil, fmt.Errorf("datapath: read tunnel map: %w", err)
	}
	return h, nil
}

// cfgHostRouting is CFG_HOST_ROUTING of bpf/coordino.h.
const cfgHostRouting = 4

// HostRouteStats are host routing's packet counters, summed over CPUs.
type HostRouteStats struct {
	// InRedirected went from the uplink (or tunnel) straight into a pod.
	InRedirected uint64
	// OutRedirected went from a pod straight to the uplink's next hop.
	OutRedirected uint64
	// HostTracked took the normal path because the host's conntrack knew
	// their flow (NAT by kube-proxy or another host rule).
	HostTracked uint64
	// NoRoute took the normal path because the FIB gave no usable next hop.
	NoRoute uint64
	// Encapsulated of OutRedirected, Decapsulated of InRedirected: carried
	// by the eBPF VXLAN tunnel instead of the VXLAN device.
	Encapsulated, Decapsulated uint64
}

// SetHostRouting turns host routing on or off for every packet from now
// on. On a kernel without nf_conntrack's BPF lookup it stays off (the
// programs would not redirect anyway): the result says which took effect.
func (d *Datapath) SetHostRouting(on bool) (bool, error) {
	unsupported := on && !d.hr.supported()
	if unsupported {
		on = false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	changed, err := d.mw.setCfgFlag(cfgHostRouting, on)
	if err != nil {
		return false, fmt.Errorf("datapath: set host routing: %w", err)
	}
	if unsupported {
		d.hr.sayUnsupported()
	}
	if changed {
		d.log.Info("host routing", zap.Bool("bpf", on))
	}
	return on, nil
}

// sayUnsupported logs, once, that the kernel cannot host-route: every peer
// change asks again.
func (h *hostRouting) sayUnsupported() {
	if h.unsupportedSaid {
		return
	}
	h.unsupportedSaid = true
	h.log.Warn("host routing: the kernel lacks bpf_skb_ct_lookup (nf_conntrack's BPF lookup; load nf_conntrack before the daemon) or the redirect helpers, so flows the host translates could not be told apart; using the host's forwarding path")
}

// supported reports whether the kernel has what host routing
// needs: the redirect helpers, and the conntrack lookup its guard asks
// (built in, or nf_conntrack's module loaded when the programs were: they
// call it only where the probe found it, bpf/lib/hostroute.h).
func (h *hostRouting) supported() bool {
	f := h.features
	return f.Has(kernel.CTLookup) && f.Has(kernel.RedirectPeer) && f.Has(kernel.RedirectNeigh)
}

// ForgetNextHops empties the programs' cache of FIB answers
// (cdo_fib_cache): every flow's next packet asks the FIB again. The daemon
// calls it on every route, rule or link change in the host's namespace; an
// answer it does not forget expires within a second anyway.
func (d *Datapath) ForgetNextHops() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hr.forgetNextHops()
}

func (h *hostRouting) forgetNextHops() error {
	m := h.maps.fibCache
	slots := make([]uint32, m.MaxEntries())
	for i := range slots {
		slots[i] = uint32(i)
	}
	empty := make([]bpf.CoordinoHrFibEntry, len(slots)*ebpf.MustPossibleCPU())
	if _, err := m.BatchUpdate(slots, empty, nil); err != nil {
		return fmt.Errorf("datapath: forget next hops: %w", err)
	}
	return nil
}

// SetPeerBlocks replaces the other nodes' pod blocks: the destinations pods
// may reach through host routing, and the sources it delivers from.
func (d *Datapath) SetPeerBlocks(blocks []netip.Prefix) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hr.setPeerBlocks(blocks)
}

func (h *hostRouting) setPeerBlocks(blocks []netip.Prefix) error {
	want := make(map[bpf.CoordinoIpcacheKey]uint32, len(blocks))
	for _, b := range blocks {
		want[ipcacheKey(b)] = 0
	}
	if err := syncBlocks(h.health, h.maps.peerBlocks, bpf.CoordinoMapCdoPeerBlocks, &h.peerBlocks, want); err != nil {
		return fmt.Errorf("datapath: peer blocks: %w", err)
	}
	return nil
}

// blockOrder orders block keys longest prefix first, then by family and
// address: of the blocks a full map lacks, it takes the same ones at every
// call.
func blockOrder(a, b bpf.CoordinoIpcacheKey) int {
	return cmp.Or(cmp.Compare(b.Prefixlen, a.Prefixlen), cmp.Compare(a.Family, b.Family), bytes.Compare(a.Addr[:], b.Addr[:]))
}

// syncBlocks makes the pinned map of blocks m (named name) hold exactly
// want, writing only what differs from *mirror, which it keeps up to date.
// A nil *mirror is read from m first: the map may hold an earlier run's
// entries. Every removal is tried, then every write in blockOrder; what m
// refuses is counted and left out (its blocks take the host's path), so a
// full map takes the first blocks of want that it lacks, and the error says
// how many are missing. Callers hold mu.
func syncBlocks[V comparable](health *mapHealth, m *ebpf.Map, name string, mirror *map[bpf.CoordinoIpcacheKey]V, want map[bpf.CoordinoIpcacheKey]V) error {
	if *mirror == nil {
		have := map[bpf.CoordinoIpcacheKey]V{}
		var (
			k bpf.CoordinoIpcacheKey
			v V
		)
		it := m.Iterate()
		for it.Next(&k, &v) {
			have[k] = v
		}
		if err := it.Err(); err != nil {
			return fmt.Errorf("read: %w", err)
		}
		*mirror = have
	}
	var errs []error
	for k := range *mirror {
		if _, ok := want[k]; ok {
			continue
		}
		if err := deleteKey(m, &k); err != nil {
			errs = append(errs, fmt.Errorf("delete: %w", health.refused(m, name, err)))
			continue
		}
		delete(*mirror, k)
	}
	var writes []bpf.CoordinoIpcacheKey
	for k, v := range want {
		if have, ok := (*mirror)[k]; !ok || have != v {
			writes = append(writes, k)
		}
	}
	// Only what changes is sorted: a peer joining costs one write, not a
	// sort of every node's blocks.
	slices.SortFunc(writes, blockOrder)
	for _, k := range writes {
		v := want[k]
		if err := m.Update(&k, &v, ebpf.UpdateAny); err != nil {
			errs = append(errs, fmt.Errorf("update: %w", health.refused(m, name, err)))
			continue
		}
		(*mirror)[k] = v
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d entries not in place: %w", len(errs), len(want), errors.Join(firstErrors(errs, 3)...))
	}
	if len(want) > 0 {
		health.accepted(name) // every block in place
	}
	return nil
}

// HostRouteStats reads host routing's counters.
func (d *Datapath) HostRouteStats() (HostRouteStats, error) {
	return d.hr.stats()
}

func (h *hostRouting) stats() (HostRouteStats, error) {
	var s HostRouteStats
	for slot, dst := range map[bpf.CoordinoHostrouteStat]*uint64{
		bpf.CoordinoHostrouteStatHR_STAT_IN_REDIRECTED:  &s.InRedirected,
		bpf.CoordinoHostrouteStatHR_STAT_OUT_REDIRECTED: &s.OutRedirected,
		bpf.CoordinoHostrouteStatHR_STAT_HOST_TRACKED:   &s.HostTracked,
		bpf.CoordinoHostrouteStatHR_STAT_NO_ROUTE:       &s.NoRoute,
		bpf.CoordinoHostrouteStatHR_STAT_ENCAPSULATED:   &s.Encapsulated,
		bpf.CoordinoHostrouteStatHR_STAT_DECAPSULATED:   &s.Decapsulated,
	} {
		var perCPU []uint64
		if err := h.maps.stats.Lookup(uint32(slot), &perCPU); err != nil {
			return s, fmt.Errorf("datapath: read host routing counters: %w", err)
		}
		for _, n := range perCPU {
			*dst += n
		}
	}
	return s, nil
}

var hostRouteDesc = prometheus.NewDesc("coordino_host_routing_packets_total",
	"Packets of eBPF host routing by outcome: redirected into a local pod (in) or to another node (out), of those decapsulated or encapsulated by the eBPF VXLAN tunnel (decapsulated, encapsulated), or left to the normal path because the host's conntrack tracks their flow (host-tracked) or the FIB gave no next hop (no-route).",
	[]string{"outcome"}, nil)

func (h *hostRouting) collect(ch chan<- prometheus.Metric) {
	s, err := h.stats()
	if err != nil {
		return
	}
	for outcome, n := range map[string]uint64{"in": s.InRedirected, "out": s.OutRedirected, "host-tracked": s.HostTracked, "no-route": s.NoRoute, "encapsulated": s.Encapsulated, "decapsulated": s.Decapsulated} {
		ch <- prometheus.MustNewConstMetric(hostRouteDesc, prometheus.CounterValue, float64(n), outcome)
	}
}

// AttachTunnelDevice attaches host routing's ingress to a tunnel device
// carrying Ethernet frames (the VXLAN device): decapsulated pod packets for
// local pods are delivered from there. The tcx link is pinned like the node
// devices' and re-attached the same way when the device is re-created.
func (d *Datapath) AttachTunnelDevice(ifname string, ifindex int) error {
	return d.att.attachDeviceHook("tunnel-"+ifname, "ingress", ifindex, d.objs.CdoFromTunnel, ebpf.AttachTCXIngress)
}

// localEpKey is cdo_local_eps' key of ip.
func localEpKey(ip netip.Addr) bpf.CoordinoLocalEpKey {
	var k bpf.CoordinoLocalEpKey
	k.Family, k.Addr = packetAddr(ip)
	return k
}

// writeLocalEp makes r reachable through host routing: only endpoints whose
// interface Coordino created (primary mode: both MACs known). Callers hold
// mu, after r's policy entries and programs are in place.
func (h *hostRouting) writeLocalEp(r *record) error {
	pod, podErr := net.ParseMAC(r.PodMAC)
	host, hostErr := net.ParseMAC(r.HostMAC)
	if podErr != nil || hostErr != nil || len(pod) != 6 || len(host) != 6 {
		return nil
	}
	v := bpf.CoordinoLocalEp{Ifindex: uint32(r.HostIfIndex)}
	copy(v.PodMac[:], pod)
	copy(v.HostMac[:], host)
	for _, ip := range r.IPs {
		k := localEpKey(ip)
		if err := h.maps.localEps.Update(&k, &v, ebpf.UpdateAny); err != nil {
			err = h.health.refused(h.maps.localEps, bpf.CoordinoMapCdoLocalEps, err)
			return fmt.Errorf("endpoint %q: host routing entry for %s: %w", r.Key, ip, err)
		}
	}
	h.health.accepted(bpf.CoordinoMapCdoLocalEps)
	return nil
}

// deleteLocalEp removes r's host routing entries that still point at r's
// interface (an address reused by a newer endpoint keeps its entry).
// Callers hold mu.
func (h *hostRouting) deleteLocalEp(r *record) error {
	var errs []error
	for _, ip := range r.IPs {
		k := localEpKey(ip)
		var v bpf.CoordinoLocalEp
		if err := h.maps.localEps.Lookup(&k, &v); err != nil {
			if !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		if v.Ifindex != uint32(r.HostIfIndex) {
			continue
		}
		if err := deleteKey(h.maps.localEps, &k); err != nil {
			errs = append(errs, fmt.Errorf("endpoint %q: remove host routing entry for %s: %w", r.Key, ip, err))
		}
	}
	return errors.Join(errs...)
}
