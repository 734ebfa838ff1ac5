package datapath

// Read-only views for the inspection service (daemon/inspect). Nothing here
// writes a map or changes the datapath's state.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// EndpointState is an attached endpoint as the datapath holds it.
type EndpointState struct {
	Endpoint
	Identity identity.ID
	// Mode is the attach mode, "tc" or "tcx".
	Mode string
	// Isolation is read from the kernel's endpoints map.
	Isolation policy.Isolation
}

// EndpointStates returns every attached endpoint, ordered by key.
func (d *Datapath) EndpointStates() []EndpointState {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]EndpointState, 0, d.eps.count())
	for _, r := range d.eps.sorted() {
		s := EndpointState{Endpoint: Endpoint{Key: r.Key, HostIfName: r.HostIfName, HostIfIndex: r.HostIfIndex,
			IPs: slices.Clone(r.IPs), Namespace: r.Namespace, Labels: maps.Clone(r.Labels)}, Identity: r.Identity, Mode: r.Mode}
		var info bpf.CoordinoEndpointInfo
		if d.objs.CdoEndpoints.Lookup(uint32(r.HostIfIndex), &info) == nil {
			s.Isolation = policy.Isolation(info.Flags)
		}
		out = append(out, s)
	}
	return out
}

// Identities returns the identities of this node's endpoints, ordered by
// number.
func (d *Datapath) Identities() []identity.Identity {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.eps.identities()
}

// DescribeIdentity says what id stands for, for policy explanations: a
// reserved identity, a pod label set in its namespace, or an ipBlock prefix.
func (d *Datapath) DescribeIdentity(id identity.ID) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.engine.DescribeIdentity(id)
}

// PolicyRevision returns the revision last written to the config map and
// the number of policies of the last snapshot skipped as invalid.
func (d *Datapath) PolicyRevision() (revision uint32, invalid int) {
	d.snapMu.Lock()
	invalid = len(d.snap.Invalid)
	d.snapMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mw.policyRevision(), invalid
}

// MapUsage is the fill of one BPF map.
type MapUsage struct {
	Name     string
	Entries  int
	Capacity int
	// UpdateFailures counts the writes the map refused since start.
	UpdateFailures uint64
	// Refusing: the map refused a write and has not taken one since, and
	// is still full or has writes pending.
	Refusing bool
}

// MapUsage reports entries and capacity of the maps that can fill up. The
// daemon-written maps are counted from their mirrors (which equal the
// kernel's content); conntrack, written by the programs, is walked.
func (d *Datapath) MapUsage() ([]MapUsage, error) {
	d.mu.Lock()
	iso, isoPending := d.iso.usage()
	eps := d.eps.usage() // source addresses, state
	out := append(d.mw.usage(), eps[0], iso, eps[1])
	for i := range out {
		pending := d.mw.pendingIn(out[i].Name)
		if out[i].Name == iso.Name {
			pending = isoPending
		}
		d.health.report(&out[i], pending)
	}
	d.mu.Unlock()
	out = append(out, MapUsage{Name: ctPurgeMapName, Entries: d.ct.pendingPurges(), Capacity: maxPendingPurges})
	ct, err := d.ct.entries()
	if err != nil {
		return nil, fmt.Errorf("datapath: count conntrack entries: %w", err)
	}
	out = append(out, MapUsage{Name: bpf.CoordinoMapCdoConntrack, Entries: ct, Capacity: int(d.objs.CdoConntrack.MaxEntries())})
	return out, nil
}

// Decision is the verdict the programs would reach for a new flow at one
// endpoint, with the map values that led to it.
type Decision = policy.Decision

// Decide looks up the kernel maps exactly as the programs' decide() does
// for the first packet of a flow at the endpoint on hostIfIndex: the
// endpoint's identity and isolation, the peer's identity from the ipcache,
// then the policy trie for the peer's identity, its CIDR identity and any
// peer. port is the destination port of the connection.
func (d *Datapath) Decide(hostIfIndex int, dir policy.Direction, peer netip.Addr, proto uint8, port uint16) (Decision, error) {
	var info bpf.CoordinoEndpointInfo
	if err := d.objs.CdoEndpoints.Lookup(uint32(hostIfIndex), &info); err != nil {
		return Decision{}, fmt.Errorf("datapath: endpoint ifindex %d not in the endpoints map: %w", hostIfIndex, err)
	}
	remote := bpf.CoordinoIpcacheValue{Identity: uint32(identity.World), CidrIdentity: uint32(identity.World)}
	peer = peer.Unmap()
	k := ipcacheKey(netip.PrefixFrom(peer, peer.BitLen()))
	if err := d.objs.CdoIpcache.Lookup(&k, &remote); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return Decision{}, fmt.Errorf("datapath: ipcache lookup %s: %w", peer, err)
	}
	dec := Decision{Local: identity.ID(info.Identity), Remote: identity.ID(remote.Identity),
		RemoteCIDR: identity.ID(remote.CidrIdentity), Isolation: policy.Isolation(info.Flags)}
	var lookupErr error
	lookup := func(k policy.Key) (policy.Value, bool) {
		pk := policyKey(k)
		var pv bpf.CoordinoPolicyValue
		err := d.objs.CdoPolicy.Lookup(&pk, &pv)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) && lookupErr == nil {
			lookupErr = fmt.Errorf("datapath: policy lookup: %w", err)
		}
		return policy.Value(pv.Flags), err == nil
	}
	dec.Verdict = policy.Decide(lookup, policy.Flow{Local: dec.Local, Isolation: dec.Isolation, Dir: dir,
		Remote: dec.Remote, RemoteCIDR: dec.RemoteCIDR, Proto: proto, Port: port})
	if lookupErr != nil {
		return Decision{}, lookupErr
	}
	return dec, nil
}

// Provenance names the policies behind a decision at a local endpoint
// (policy.Explainer.Provenance).
func (d *Datapath) Provenance(dec Decision, dir policy.Direction, peer netip.Addr, proto uint8, port uint16) (selectedBy, allowedBy []string) {
	return d.explainer().Provenance(dec, dir, peer, proto, port)
}

// DecidedBy names the ClusterNetworkPolicy rule behind a decision of a
// tier (policy.Explainer.DecidedBy).
func (d *Datapath) DecidedBy(dec Decision, dir policy.Direction, peer netip.Addr, proto uint8, port uint16) string {
	return d.explainer().DecidedBy(dec, dir, peer, proto, port)
}

// explainer is the policies in force and what they are compiled with.
func (d *Datapath) explainer() policy.Explainer {
	d.snapMu.Lock()
	defer d.snapMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	return policy.NewExplainer(&d.snap, d.eps.identities(), d.engine.NamedPortPods(), d.cidrs)
}

// DumpMaps writes the datapath maps as JSON, for bug reports: config,
// endpoints, ipcache, policy and up to maxConntrack conntrack entries.
func (d *Datapath) DumpMaps(w io.Writer, maxConntrack int) error {
	type entry struct {
		Key   any `json:"key"`
		Value any `json:"value"`
	}
	out := map[string]any{}
	var cfg bpf.CoordinoConfig
	if err := d.objs.CdoConfig.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("datapath: read config map: %w", err)
	}
	out[bpf.CoordinoMapCdoConfig] = map[string]uint32{"policyRevision": cfg.PolicyRevision, "flags": cfg.Flags}

	var eps []entry
	var ek uint32
	var ev bpf.CoordinoEndpointInfo
	it := d.objs.CdoEndpoints.Iterate()
	for it.Next(&ek, &ev) {
		eps = append(eps, entry{ek, map[string]uint32{"identity": ev.Identity, "flags": ev.Flags}})
	}
	out[bpf.CoordinoMapCdoEndpoints] = eps

	var ips []entry
	var ik bpf.CoordinoIpcacheKey
	var iv bpf.CoordinoIpcacheValue
	it2 := d.objs.CdoIpcache.Iterate()
	for it2.Next(&ik, &iv) {
		p, err := prefixOf(ik)
		if err != nil {
			continue
		}
		ips = append(ips, entry{p.String(), map[string]uint32{"identity": iv.Identity, "cidrIdentity": iv.CidrIdentity}})
	}
	out[bpf.CoordinoMapCdoIpcache] = ips

	var pol []string
	var pk bpf.CoordinoPolicyKey
	var pv bpf.CoordinoPolicyValue
	it3 := d.objs.CdoPolicy.Iterate()
	for it3.Next(&pk, &pv) {
		k := fromPolicyKey(pk)
		pol = append(pol, fmt.Sprintf("local=%s remote=%s dir=%s proto=%d port=%d/%d", k.Local, k.Remote, k.Dir, k.Proto, k.Port, k.Prefix))
	}
	out[bpf.CoordinoMapCdoPolicy] = pol

	var cts []string
	var ck bpf.CoordinoCtKey
	var cv bpf.CoordinoCtEntry
	it4 := d.objs.CdoConntrack.Iterate()
	for len(cts) < maxConntrack && it4.Next(&ck, &cv) {
		src, dst := ctAddr(ck.Family, ck.Src), ctAddr(ck.Family, ck.Dst)
		cts = append(cts, fmt.Sprintf("ifindex=%d dir=%d proto=%d %s:%d -> %s:%d revision=%d flags=%#x",
			ck.Ifindex, ck.Dir, ck.Proto, src, ntohs(ck.Sport), dst, ntohs(ck.Dport), cv.Revision, cv.Flags))
	}
	out[bpf.CoordinoMapCdoConntrack] = cts
	for _, err := range []error{it.Err(), it2.Err(), it3.Err(), it4.Err()} {
		if err != nil {
			return fmt.Errorf("datapath: dump maps: %w", err)
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func ctAddr(family uint8, b [16]uint8) netip.Addr {
	if family == 4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}
