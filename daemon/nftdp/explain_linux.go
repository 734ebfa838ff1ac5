package nftdp

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/coordino/coordino/daemon/datapath"
	"github.com/coordino/coordino/daemon/datapath/dpapi"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// Explain (coordinoctl policy explain) in nftables mode: the decision is
// read from what the table was rendered from, the engine's keys and the
// endpoints' chains, and the rules behind it are named by the same
// policy.Explainer as in eBPF mode.

// EndpointStates returns the attached endpoints with the isolation their
// chains enforce.
func (d *Datapath) EndpointStates() []datapath.EndpointState {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]datapath.EndpointState, 0, len(d.eps))
	for _, k := range slices.Sorted(maps.Keys(d.eps)) {
		r := d.eps[k]
		if r.dying {
			continue
		}
		out = append(out, datapath.EndpointState{Endpoint: dpapi.Endpoint{Key: r.Key, HostIfName: r.HostIfName, HostIfIndex: r.HostIfIndex,
			IPs: slices.Clone(r.IPs), Namespace: r.Namespace, Labels: maps.Clone(r.Labels), Pod: r.Pod},
			Identity: r.Identity, Mode: "nftables", Isolation: d.inst.eps[r.HostIfName].iso})
	}
	return out
}

// Decide is the verdict the table gives the first packet of a flow at the
// endpoint on hostIfIndex: its chain's identity and isolation, the peer's
// identity as the pods and cidrs maps hold it, and the allow keys the
// pair chains were rendered from.
func (d *Datapath) Decide(hostIfIndex int, dir policy.Direction, peer netip.Addr, proto uint8, port uint16) (policy.Decision, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := d.byIfIndex(hostIfIndex)
	if r == nil {
		return policy.Decision{}, fmt.Errorf("nftables datapath: no endpoint on interface index %d", hostIfIndex)
	}
	st, ok := d.inst.eps[r.HostIfName]
	if !ok || st.id != r.Identity {
		return policy.Decision{}, fmt.Errorf("nftables datapath: endpoint %q: its chains are not rendered yet", r.Key)
	}
	peer = peer.Unmap()
	dec := policy.Decision{Local: r.Identity, Remote: d.identityOf(peer), RemoteCIDR: d.engine.CIDRIdentity(peer), Isolation: st.iso}
	// The table renders the engine's keys, tiers included: the engine's
	// values are what the rules decide.
	dec.Verdict = policy.Decide(d.engine.EngineLookup, policy.Flow{Local: dec.Local, Isolation: dec.Isolation, Dir: dir,
		Remote: dec.Remote, RemoteCIDR: dec.RemoteCIDR, Proto: proto, Port: port})
	return dec, nil
}

// Provenance names the policies behind a decision (policy.Explainer).
func (d *Datapath) Provenance(dec policy.Decision, dir policy.Direction, peer netip.Addr, proto uint8, port uint16) (selectedBy, allowedBy []string) {
	return d.explainer().Provenance(dec, dir, peer, proto, port)
}

// DecidedBy names the cluster policy rule behind a tier's decision.
func (d *Datapath) DecidedBy(dec policy.Decision, dir policy.Direction, peer netip.Addr, proto uint8, port uint16) string {
	return d.explainer().DecidedBy(dec, dir, peer, proto, port)
}

// DescribeIdentity says what an identity stands for.
func (d *Datapath) DescribeIdentity(id identity.ID) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.engine.DescribeIdentity(id)
}

// ServiceAddress is always false: the forward hook sees Service traffic
// after kube-proxy's DNAT, so explain decides on the backend it names.
func (d *Datapath) ServiceAddress(netip.Addr) bool { return false }

// ServiceTarget is always false, for the same reason (node ports too).
func (d *Datapath) ServiceTarget(netip.Addr, uint8, uint16) bool { return false }

// ServiceHookError is nil: no stage of its own is needed after DNAT.
func (d *Datapath) ServiceHookError() error { return nil }

func (d *Datapath) explainer() policy.Explainer {
	d.snapMu.Lock()
	defer d.snapMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]identity.Identity, 0, len(d.eps))
	seen := map[identity.ID]bool{}
	for _, k := range slices.Sorted(maps.Keys(d.eps)) {
		r := d.eps[k]
		if !seen[r.Identity] {
			seen[r.Identity] = true
			ids = append(ids, identity.Identity{ID: r.Identity, Namespace: r.Namespace, Labels: maps.Clone(r.Labels)})
		}
	}
	slices.SortFunc(ids, func(a, b identity.Identity) int { return int(a.ID) - int(b.ID) })
	return policy.NewExplainer(&d.snap, ids, d.engine.NamedPortPods(), d.cidrs)
}
