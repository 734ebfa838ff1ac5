package datapath

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
	"go.uber.org/zap"
)

// sync recompiles the current snapshot for the local identities and writes
// the difference to the maps: additions first, then endpoint isolation
// flags, then deletions, so a flow allowed before and after never sees a
// gap. Finally it bumps the policy revision, which makes the programs
// re-check tracked flows against the new maps on their next packet.
// Invalid policies are skipped, counted and logged; only map failures return.
func (d *Datapath) sync() error {
	local := map[identity.ID]bool{}
	for _, r := range d.eps {
		local[r.Identity] = true
	}
	in := policy.Input{Snapshot: d.snap, Identities: d.knownIdentities()}
	for id := range local {
		in.Local = append(in.Local, id)
	}
	res, cerr := policy.Compile(in, d.cidrs)
	if res == nil {
		return fmt.Errorf("compile policy: %w", cerr)
	}
	d.compileErr = cerr
	d.metrics.setCompileError(cerr)
	if cerr != nil {
		d.log.Warn("invalid network policies skipped", zap.Error(cerr))
	}
	for _, w := range res.Warnings {
		d.log.Debug("policy warning", zap.String("warning", w))
	}

	wantPolicy := res.Table()
	wantIP := map[netip.Prefix]bpf.CoordinoIpcacheValue{}
	for p, id := range res.CIDRs {
		wantIP[p] = bpf.CoordinoIpcacheValue{Identity: uint32(id), CidrIdentity: uint32(id)}
	}
	host := func(ip netip.Addr, id identity.ID) {
		ip = ip.Unmap()
		wantIP[netip.PrefixFrom(ip, ip.BitLen())] = bpf.CoordinoIpcacheValue{
			Identity: uint32(id), CidrIdentity: uint32(res.CIDRIdentity(ip)),
		}
	}
	for _, ip := range d.cfg.NodeIPs {
		host(ip, identity.Host)
	}
	wantEP := map[uint32]bpf.CoordinoEndpointInfo{}
	for _, r := range d.eps {
		for _, ip := range r.IPs {
			host(ip, r.Identity)
		}
		wantEP[uint32(r.HostIfIndex)] = bpf.CoordinoEndpointInfo{
			Identity: uint32(r.Identity), Flags: uint32(res.Isolation[r.Identity]),
		}
	}

	changed := false
	for p, v := range wantIP {
		if old, ok := d.mirror.ipcache[p]; ok && old == v {
			continue
		}
		k := ipcacheKey(p)
		if err := d.objs.CdoIpcache.Update(&k, &v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("update ipcache %s: %w", p, err)
		}
		d.mirror.ipcache[p], changed = v, true
	}
	for k := range wantPolicy {
		if _, ok := d.mirror.policy[k]; ok {
			continue
		}
		bk := policyKey(k)
		if err := d.objs.CdoPolicy.Update(&bk, &bpf.CoordinoPolicyValue{}, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("update policy map (%d entries): %w", len(d.mirror.policy), err)
		}
		d.mirror.policy[k], changed = struct{}{}, true
	}
	for ifindex, v := range wantEP {
		if old, ok := d.mirror.endpoints[ifindex]; ok && old == v {
			continue
		}
		if err := d.objs.CdoEndpoints.Update(&ifindex, &v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("update endpoint ifindex %d: %w", ifindex, err)
		}
		d.mirror.endpoints[ifindex], changed = v, true
	}
	if err := d.deleteStale(wantEP, wantIP, wantPolicy, &changed); err != nil {
		return err
	}
	d.cidrs.Retain(keys(res.CIDRs))
	if changed {
		return d.bumpRevision()
	}
	return nil
}

func (d *Datapath) deleteStale(wantEP map[uint32]bpf.CoordinoEndpointInfo,
	wantIP map[netip.Prefix]bpf.CoordinoIpcacheValue, wantPolicy policy.Table, changed *bool) error {
	for ifindex := range d.mirror.endpoints {
		if _, ok := wantEP[ifindex]; ok {
			continue
		}
		if err := deleteKey(d.objs.CdoEndpoints, &ifindex); err != nil {
			return fmt.Errorf("delete endpoint ifindex %d: %w", ifindex, err)
		}
		delete(d.mirror.endpoints, ifindex)
		*changed = true
	}
	for k := range d.mirror.policy {
		if _, ok := wantPolicy[k]; ok {
			continue
		}
		bk := policyKey(k)
		if err := deleteKey(d.objs.CdoPolicy, &bk); err != nil {
			return fmt.Errorf("delete policy entry: %w", err)
		}
		delete(d.mirror.policy, k)
		*changed = true
	}
	for p := range d.mirror.ipcache {
		if _, ok := wantIP[p]; ok {
			continue
		}
		k := ipcacheKey(p)
		if err := deleteKey(d.objs.CdoIpcache, &k); err != nil {
			return fmt.Errorf("delete ipcache %s: %w", p, err)
		}
		delete(d.mirror.ipcache, p)
		*changed = true
	}
	return nil
}

// syncEndpointsOnly removes map entries of detached endpoints without
// recompiling; used before the first policy snapshot arrives.
func (d *Datapath) syncEndpointsOnly() error {
	if d.synced {
		return nil
	}
	live := map[uint32]bool{}
	addrs := map[netip.Prefix]bool{}
	for _, r := range d.eps {
		live[uint32(r.HostIfIndex)] = true
		for _, ip := range r.IPs {
			addrs[netip.PrefixFrom(ip, ip.BitLen())] = true
		}
	}
	for ifindex := range d.mirror.endpoints {
		if live[ifindex] {
			continue
		}
		if err := deleteKey(d.objs.CdoEndpoints, &ifindex); err != nil {
			return fmt.Errorf("delete endpoint ifindex %d: %w", ifindex, err)
		}
		delete(d.mirror.endpoints, ifindex)
	}
	for p, v := range d.mirror.ipcache {
		id := identity.ID(v.Identity)
		if addrs[p] || id.IsCIDR() || id == identity.Host {
			continue
		}
		k := ipcacheKey(p)
		if err := deleteKey(d.objs.CdoIpcache, &k); err != nil {
			return fmt.Errorf("delete ipcache %s: %w", p, err)
		}
		delete(d.mirror.ipcache, p)
	}
	return d.bumpRevision()
}

func (d *Datapath) bumpRevision() error {
	d.revision++
	if err := d.writeConfig(); err != nil {
		return fmt.Errorf("update policy revision: %w", err)
	}
	return nil
}

// writeConfig stores the revision and flags; callers hold mu, so neither
// write can undo the other.
func (d *Datapath) writeConfig() error {
	cfg := bpf.CoordinoConfig{PolicyRevision: d.revision, Flags: d.cfgFlags}
	return d.objs.CdoConfig.Update(uint32(0), &cfg, ebpf.UpdateAny)
}

// purgeConntrack drops tracked flows of a removed interface, so a future
// interface reusing the index starts clean.
func (d *Datapath) purgeConntrack(ifindex uint32) {
	var (
		k    bpf.CoordinoCtKey
		v    bpf.CoordinoCtEntry
		dead []bpf.CoordinoCtKey
	)
	it := d.objs.CdoConntrack.Iterate()
	for it.Next(&k, &v) {
		if k.Ifindex == ifindex {
			dead = append(dead, k)
		}
	}
	for i := range dead {
		_ = deleteKey(d.objs.CdoConntrack, &dead[i])
	}
}

func keys[K comparable, V any](m map[K]V) map[K]bool {
	out := make(map[K]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}
