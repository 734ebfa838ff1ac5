package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"go.uber.org/zap"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/nodeiso"
	"github.com/coordino/coordino/daemon/policy"
)

// Node isolation (NodeIsolationPolicy, bpf/lib/nodeiso.h). Other nodes'
// addresses get the remote-node identity in the ipcache (SetRemoteNodeIPs);
// the policies arrive with each snapshot (UpdatePolicy); the node-to-node
// programs sit on the node's underlay and tunnel devices (AttachNodeDevice).

// nodeIsolation is node isolation's part: the policies and tunnel ports
// it compiles, and cdo_nodeiso and its flags, which it writes. Callers hold
// the datapath's lock.
type nodeIsolation struct {
	m, cfg *ebpf.Map // cdo_nodeiso, cdo_nodeiso_cfg
	health *mapHealth
	retry  *retrier
	log    *zap.Logger
	// bump bumps the policy revision after a change: tracked pod flows
	// towards node addresses are re-decided at their next packet.
	bump func() error

	tunnelPorts []uint16
	policies    []*coordinov1alpha1.NodeIsolationPolicy
	// keys mirrors cdo_nodeiso (nil until read); flags cdo_nodeiso_cfg.
	keys  map[policy.Key]struct{}
	flags uint32
	// failed: the last apply did not write everything; retried with flush.
	failed bool
}

// setPolicies replaces the policies apply compiles (the snapshot's).
func (n *nodeIsolation) setPolicies(pols []*coordinov1alpha1.NodeIsolationPolicy) { n.policies = pols }

// setTunnelPorts replaces the ports nodes always accept from each other.
func (n *nodeIsolation) setTunnelPorts(ports []uint16) { n.tunnelPorts = slices.Clone(ports) }

// pending reports whether the last apply left writes undone.
func (n *nodeIsolation) pending() bool { return n.failed }

// usage reports cdo_nodeiso's fill and whether writes are pending.
func (n *nodeIsolation) usage() (u MapUsage, pending int) {
	if n.failed {
		pending = 1
	}
	return MapUsage{Name: bpf.CoordinoMapCdoNodeiso, Entries: len(n.keys), Capacity: int(n.m.MaxEntries())}, pending
}

// SetRemoteNodeIPs replaces the addresses of the other nodes (from the peers
// list): they take the remote-node identity, which pod -> other node and
// node -> node isolation judge. This node's own addresses stay the host's.
func (d *Datapath) SetRemoteNodeIPs(ips []netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ip := range slices.Concat(d.remoteNodeIPs, ips) {
		d.mw.markAddr(ip)
	}
	d.remoteNodeIPs = slices.Clone(ips)
	return d.flush("update remote node addresses")
}

// SetTunnelPorts sets the UDP ports nodes always accept from each other
// while node-to-node traffic is isolated (WireGuard, VXLAN).
func (d *Datapath) SetTunnelPorts(ports []uint16) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.iso.setTunnelPorts(ports)
	if !d.synced {
		return nil
	}
	return d.iso.apply()
}

// apply brings cdo_nodeiso and its flags in line with the
// policies. Fail closed: isolation bits that go away are cleared first,
// stale allows deleted before new ones are added, new isolation bits set
// last, so no intermediate state allows what neither the old nor the new
// policies allow. Then the revision is bumped: tracked pod flows towards
// node addresses are re-decided at their next packet. A write that fails
// stops the apply there (what is left stays as the old policies had it)
// and is retried with the policy maps' backoff.
func (n *nodeIsolation) apply() error {
	rules, compileErr := nodeiso.Compile(n.policies, n.tunnelPorts)
	if err := n.readMirror(); err != nil {
		return err
	}
	var flags uint32
	if rules.PodToHost {
		flags |= uint32(bpf.CoordinoNodeisoFlagNODEISO_POD_TO_HOST)
	}
	if rules.NodeToNode {
		flags |= uint32(bpf.CoordinoNodeisoFlagNODEISO_NODE_TO_NODE)
	}
	changed, err := n.write(rules.Keys, flags)
	if changed {
		if err == nil {
			n.log.Info("node isolation applied", zap.Bool("podToHost", rules.PodToHost), zap.Bool("nodeToNode", rules.NodeToNode),
				zap.Int("entries", len(rules.Keys)), zap.Int("policies", len(n.policies)))
		}
		err = errors.Join(err, n.bump())
	}
	n.failed = err != nil
	if err != nil {
		n.retry.schedule()
	} else {
		n.retry.done()
	}
	if compileErr != nil {
		err = errors.Join(err, fmt.Errorf("datapath: node isolation: %w", compileErr))
	}
	return err
}

// write makes cdo_nodeiso hold keys and the flags be flags, in
// the order apply gives, stopping at the first failed write.
// Keys are added in their order (tunnel ports first: isolation must never
// cut the pod network), so what fits of them is always the same.
func (n *nodeIsolation) write(keys []policy.Key, flags uint32) (changed bool, err error) {
	const name = bpf.CoordinoMapCdoNodeiso
	if cleared := n.flags &^ flags; cleared != 0 {
		if err := n.writeFlags(n.flags &^ cleared); err != nil {
			return changed, err
		}
		changed = true
	}
	want := make(map[policy.Key]struct{}, len(keys))
	for _, k := range keys {
		want[k] = struct{}{}
	}
	for k := range n.keys {
		if _, ok := want[k]; ok {
			continue
		}
		bk := policyKey(k)
		if err := deleteKey(n.m, &bk); err != nil {
			return changed, fmt.Errorf("datapath: delete node isolation entry: %w", n.health.refused(n.m, name, err))
		}
		delete(n.keys, k)
		changed = true
	}
	for i, k := range keys {
		if _, ok := n.keys[k]; ok {
			continue
		}
		bk := policyKey(k)
		if err := n.m.Update(&bk, &bpf.CoordinoPolicyValue{}, ebpf.UpdateAny); err != nil {
			// New isolation stays off: its allows are not all in.
			return changed, fmt.Errorf("datapath: add node isolation entry %d of %d (%d held): %w",
				i+1, len(keys), len(n.keys), n.health.refused(n.m, name, err))
		}
		n.keys[k] = struct{}{}
		n.health.accepted(name)
		changed = true
	}
	if flags != n.flags {
		if err := n.writeFlags(flags); err != nil {
			return changed, err
		}
		changed = true
	}
	return changed, nil
}

func (n *nodeIsolation) writeFlags(flags uint32) error {
	if err := n.cfg.Update(uint32(0), &bpf.CoordinoNodeisoConfig{Flags: flags}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("datapath: write node isolation flags: %w", err)
	}
	n.flags = flags
	return nil
}

// readMirror adopts what a previous daemon left in the maps.
func (n *nodeIsolation) readMirror() error {
	if n.keys != nil {
		return nil
	}
	keys := map[policy.Key]struct{}{}
	var (
		k bpf.CoordinoPolicyKey
		v bpf.CoordinoPolicyValue
	)
	it := n.m.Iterate()
	for it.Next(&k, &v) {
		keys[fromPolicyKey(k)] = struct{}{}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("datapath: read node isolation map: %w", err)
	}
	var cfg bpf.CoordinoNodeisoConfig
	if err := n.cfg.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("datapath: read node isolation flags: %w", err)
	}
	n.keys, n.flags = keys, cfg.Flags
	return nil
}

// AttachNodeDevice attaches the node-to-node programs to a node interface:
// the underlay (Ethernet) or an L3 tunnel device such as the userspace
// WireGuard TUN (l3). The tcx links are pinned, so enforcement outlives a
// daemon restart; calling it again re-points them at the current programs,
// or re-attaches when the interface was re-created under the same name.
func (d *Datapath) AttachNodeDevice(ifname string, ifindex int, l3 bool) error {
	in, out := d.objs.CdoFromNode, d.objs.CdoToNode
	if l3 {
		in, out = d.objs.CdoFromNodeL3, d.objs.CdoToNodeL3
	}
	dir := "node-" + ifname
	return errors.Join(
		d.att.attachDeviceHook(dir, "ingress", ifindex, in, ebpf.AttachTCXIngress),
		d.att.attachDeviceHook(dir, "egress", ifindex, out, ebpf.AttachTCXEgress))
}

// PruneDeviceHooks unpins the node and tunnel device hooks whose interface
// is gone (the kernel detached them with it; an interface re-created under
// the same name gets new ones from the next attach), and detaches every
// tunnel hook but keepTunnel's (host routing turned off, or the routing is
// no longer VXLAN). Their pins would otherwise stay in the BPF directory.
func (d *Datapath) PruneDeviceHooks(keepTunnel string) error {
	return d.att.pruneDeviceHooks(keepTunnel)
}
