package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/postdnat"
)

// NodePort is one of this node's addresses on a Service's NodePort port
// and protocol: kube-proxy translates it in PREROUTING as it does a
// ClusterIP, so new flows of egress-isolated pods to it are decided on the
// backend by the post-DNAT stage. Only exact (address, protocol, port)
// triples are deferred: the node's address on any other port is judged on
// the address, as before.
type NodePort = postdnat.NodePort

// SetNodePorts makes the deferred node ports exactly nps (the first full
// view after a start, which replaces what a previous daemon left in the
// pinned map), by the difference.
func (d *Datapath) SetNodePorts(nps []NodePort) error {
	want := map[NodePort]bool{}
	for _, np := range nps {
		want[np.Canonical()] = true
	}
	d.svc.mu.RLock()
	var del []NodePort
	for np := range d.svc.nodePorts {
		if !want[np] {
			del = append(del, np)
		}
	}
	d.svc.mu.RUnlock()
	return d.UpdateNodePorts(nps, del)
}

// UpdateNodePorts adds and removes deferred node ports, element by element
// (the Services that changed, not all of them): in cdo_svc_nodeports and,
// where the nftables stage runs, in its set. A port removed forgets its
// flows still pending (their next packet is judged anew), as a Service
// CIDR withdrawn does.
func (d *Datapath) UpdateNodePorts(add, del []NodePort) error {
	sv := d.svc
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.nodePorts == nil {
		sv.nodePorts = map[NodePort]bool{}
	}
	var added, removed []NodePort
	for _, np := range del {
		np = np.Canonical()
		if !sv.nodePorts[np] {
			continue
		}
		k := nodePortKey(np)
		if err := sv.nodePortMap.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("datapath: remove node port %s: %w", np, err)
		}
		delete(sv.nodePorts, np)
		removed = append(removed, np)
	}
	for _, np := range add {
		np = np.Canonical()
		if err := np.Valid(); err != nil {
			return fmt.Errorf("datapath: node port %s: %w", np, err)
		}
		if sv.nodePorts[np] {
			continue
		}
		k := nodePortKey(np)
		if err := sv.nodePortMap.Update(&k, uint8(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("datapath: write node port %s: %w", np, err)
		}
		sv.nodePorts[np] = true
		added = append(added, np)
	}
	switch {
	case sv.stage == ServiceStageNone && errors.Is(sv.hookErr, errNoServiceCIDRs) && len(sv.nodePorts) > 0:
		// The first thing to defer: the stage is attached now.
		if err := sv.setupLocked(); err != nil {
			return err
		}
	case sv.stage == ServiceStageNftables && len(added)+len(removed) > 0:
		if err := postdnat.UpdateNodePorts(added, removed); err != nil {
			return err
		}
	}
	if len(removed) > 0 {
		sv.purgeServiceFlows()
	}
	return nil
}

// ServiceTarget reports whether a flow to addr:port (proto) is decided
// after DNAT for egress-isolated pods: addr lies in a Service CIDR, or is
// a deferred node port.
func (d *Datapath) ServiceTarget(addr netip.Addr, proto uint8, port uint16) bool {
	sv := d.svc
	sv.mu.RLock()
	defer sv.mu.RUnlock()
	return sv.containsLocked(addr) || sv.nodePorts[NodePort{Addr: addr, Proto: proto, Port: port}.Canonical()]
}

// adoptNodePorts reads what a previous daemon left in the pinned map: those
// stay deferred until the first full view (SetNodePorts) says otherwise,
// so a restart never judges a NodePort flow on the node address.
func (sv *services) adoptNodePorts() error {
	sv.nodePorts = map[NodePort]bool{}
	var (
		k bpf.CoordinoSvcNodeportKey
		v uint8
	)
	it := sv.nodePortMap.Iterate()
	for it.Next(&k, &v) {
		np := NodePort{Proto: k.Proto, Port: ntohs(k.Port), Addr: netip.AddrFrom16(k.Addr)}
		if k.Family == 4 {
			np.Addr = netip.AddrFrom4([4]byte(k.Addr[:4]))
		}
		sv.nodePorts[np] = true
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("datapath: read node ports: %w", err)
	}
	return nil
}

// nodePortKey is np's key in cdo_svc_nodeports.
func nodePortKey(np NodePort) bpf.CoordinoSvcNodeportKey {
	k := bpf.CoordinoSvcNodeportKey{Proto: np.Proto, Port: htons(np.Port)}
	if np.Addr.Is4() {
		k.Family = 4
		a := np.Addr.As4()
		copy(k.Addr[:], a[:])
	} else {
		k.Family = 6
		k.Addr = np.Addr.As16()
	}
	return k
}
