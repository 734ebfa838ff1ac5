package nftdp

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/nodeiso"
	"github.com/coordino/coordino/daemon/policy"
)

// Node isolation (NodeIsolationPolicy) as the eBPF datapath enforces it
// (bpf/lib/nodeiso.h), compiled by the same nodeiso.Compile:
//   - pod -> host: what a pod sends to this node's addresses (input hook)
//     or to other nodes' (forward hook) passes chainIsoPod first, which
//     drops a port no policy allows, before the pod's own chain;
//   - node -> node: what other nodes' addresses open towards this node's
//     passes chainIsoNode (input hook): TCP SYNs, ICMP echo requests and
//     every other packet of the opening direction; replies to what this
//     node opened pass, as conntrack knows them.
// The allowed ports are interval sets of protocol . port updated by
// element deltas; a direction turning on or off rewrites its few rules.
// Both chains stay empty until a policy isolates their direction.

const (
	setNodes4 = "nodes4" // other nodes' addresses (the remote-node identity)
	setNodes6 = "nodes6"
	// Allowed protocol . port ranges: pods to this node, pods to other
	// nodes, other nodes to this node.
	setIsoPodHost = "iso-pod-host"
	setIsoPodNode = "iso-pod-node"
	setIsoNode    = "iso-node"

	chainIsoPod  = "nodeiso-pod"
	chainIsoNode = "nodeiso-node"

	// The eBPF datapath's reason names (REASON_NODE_ISOLATED,
	// REASON_NODE_TO_NODE_DENIED).
	reasonNodeIsolated = "node-isolated"
	reasonNodeDenied   = "node-to-node-denied"
)

var typeProtoPort = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)

// isoSets are the allowed-port sets, each with the key group it holds.
var isoSets = []struct {
	name string
	g    group
}{
	{setIsoPodHost, group{local: nodeiso.LocalPod, remote: identity.Host, dir: policy.Egress}},
	{setIsoPodNode, group{local: nodeiso.LocalPod, remote: identity.RemoteNode, dir: policy.Egress}},
	{setIsoNode, group{local: identity.Host, remote: identity.RemoteNode, dir: policy.Ingress}},
}

// addNodeIsoLayout adds node isolation's sets and chains to the layout.
func (l *layout) addNodeIsoLayout() {
	t := l.table
	for _, s := range []*nftables.Set{
		{Name: setNodes4, KeyType: nftables.TypeIPAddr},
		{Name: setNodes6, KeyType: nftables.TypeIP6Addr},
	} {
		s.Table = t
		l.sets[s.Name] = s
	}
	for _, s := range isoSets {
		l.sets[s.name] = &nftables.Set{Table: t, Name: s.name, Interval: true, Concatenation: true, KeyType: typeProtoPort}
	}
	l.isoChains = map[string]*nftables.Chain{
		chainIsoPod:  {Table: t, Name: chainIsoPod},
		chainIsoNode: {Table: t, Name: chainIsoNode},
	}
}

// isoHookRules come before a hook chain's dispatch: pods' packets go
// through the pod -> node chain, and in the input hook every packet
// through the node -> node chain.
func isoHookRules(hook string) [][]expr.Any {
	if hook != chainEgress && hook != chainInput {
		return nil
	}
	out := [][]expr.Any{{dispatchKey(policy.Egress),
		&expr.Lookup{SourceRegister: 1, SetName: setPodIfs},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: chainIsoPod}}}
	if hook == chainInput {
		out = append(out, []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chainIsoNode}})
	}
	return out
}

// isoTrackedReturn: replies and related packets (ICMP errors) are not
// node isolation's to judge.
func isoTrackedReturn() [][]expr.Any {
	var out [][]expr.Any
	for _, r := range trackedRules() {
		r = slices.Clone(r)
		r[len(r)-1] = verdict(expr.VerdictReturn)
		out = append(out, r)
	}
	return out
}

// isoPortLookup matches a packet whose protocol . destination port is not
// in set (for protocols without ports the set holds their whole range).
func isoPortLookup(set string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regConcat},
		&expr.Payload{DestRegister: regConcat + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: regConcat, SetName: set, Invert: true},
	}
}

func addrIn(f family, offset uint32, set string) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: f.addrLen},
		&expr.Lookup{SourceRegister: 1, SetName: set},
	}
}

func nodesSet(f family) string {
	if f.v6 {
		return setNodes6
	}
	return setNodes4
}

// isoPodRules is chainIsoPod's content while pod -> host is isolated. A
// packet from an address not its pod's returns unjudged: the pod's chain
// drops it as spoofed, as the eBPF program checks the source first.
func isoPodRules() [][]expr.Any {
	out := isoTrackedReturn()
	for _, f := range families {
		out = append(out, append(f.match(), &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: regConcat},
			&expr.Payload{DestRegister: regConcat + 4, Base: expr.PayloadBaseNetworkHeader, Offset: f.srcOffset, Len: f.addrLen},
			&expr.Lookup{SourceRegister: regConcat, SetName: f.src, Invert: true},
			verdict(expr.VerdictReturn)))
	}
	pfx := logPrefix{dir: policy.Egress, reason: reasonNodeIsolated}
	for _, f := range families {
		for _, dst := range []struct{ addrs, ports string }{{f.host, setIsoPodHost}, {nodesSet(f), setIsoPodNode}} {
			m := append(f.match(), addrIn(f, f.dstOffset, dst.addrs)...)
			out = append(out, dropRules(append(m, isoPortLookup(dst.ports)...), pfx, dropCounter(policy.Egress, reasonNodeIsolated))...)
		}
	}
	return out
}

// isoNodeRules is chainIsoNode's content while node -> node is isolated:
// as the eBPF program, only what opens a flow is judged (a TCP segment
// other than a bare SYN belongs to a connection, ICMP other than an echo
// request is a reply or an error).
func isoNodeRules() [][]expr.Any {
	out := isoTrackedReturn()
	proto := func(p byte) []expr.Any {
		return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
	}
	out = append(out, append(proto(unix.IPPROTO_TCP),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x12}, Xor: []byte{0}}, // SYN|ACK
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0x02}},
		verdict(expr.VerdictReturn)))
	for _, echo := range []struct{ proto, typ byte }{{unix.IPPROTO_ICMP, 8}, {unix.IPPROTO_ICMPV6, 128}} {
		out = append(out, append(proto(echo.proto),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{echo.typ}},
			verdict(expr.VerdictReturn)))
	}
	pfx := logPrefix{dir: policy.Ingress, reason: reasonNodeDenied}
	for _, f := range families {
		m := append(f.match(), addrIn(f, f.srcOffset, nodesSet(f))...)
		m = append(m, addrIn(f, f.dstOffset, f.host)...)
		out = append(out, dropRules(append(m, isoPortLookup(setIsoNode)...), pfx, dropCounter(policy.Ingress, reasonNodeDenied))...)
	}
	return out
}

// isoElem is one protocol . port range of an allowed-port set.
type isoElem struct {
	protoLo, protoHi uint8
	portLo, portHi   uint16
}

func (e isoElem) setElement() nftables.SetElement {
	key := func(p uint8, port uint16) []byte {
		return binary.BigEndian.AppendUint16([]byte{p, 0, 0, 0}, port)
	}
	return nftables.SetElement{Key: append(key(e.protoLo, e.portLo), 0, 0), KeyEnd: append(key(e.protoHi, e.portHi), 0, 0)}
}

// isoElems renders the keys of g as set elements: a protocol without
// ports is keyed with port 0, as the eBPF programs key it, so a block
// holding 0 allows all of it.
func isoElems(g group, keys []policy.Key) map[isoElem]struct{} {
	out := map[isoElem]struct{}{}
	if len(keys) == 0 {
		return out
	}
	for _, el := range groupElems(g, keys) {
		e := isoElem{protoLo: el.protoLo, protoHi: el.protoHi, portLo: el.portLo, portHi: el.portHi}
		if el.protoLo == el.protoHi && !portProto(el.protoLo) {
			if el.portLo != 0 {
				continue
			}
			e.portHi = 65535
		}
		out[e] = struct{}{}
	}
	return out
}

// nodeIsoState is what node isolation holds: its inputs, and what the
// table holds of it (nil elems until the first flush wrote it).
type nodeIsoState struct {
	policies    []*coordinov1alpha1.NodeIsolationPolicy
	tunnelPorts []uint16
	remoteNodes []netip.Addr

	podToHost, nodeToNode bool
	elems                 map[string]map[isoElem]struct{}
	nodes                 map[netip.Addr]struct{}
}

// SetRemoteNodeIPs replaces the other nodes' addresses (from the peers
// list): the remote-node identity, which pod -> other node and node ->
// node isolation judge. This node's own addresses stay the host's.
func (d *Datapath) SetRemoteNodeIPs(ips []netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.iso.remoteNodes = unmapAll(ips)
	d.dirty.iso = true
	return d.flush()
}

// SetTunnelPorts sets the UDP ports nodes always accept from each other
// while node-to-node traffic is isolated (WireGuard, VXLAN).
func (d *Datapath) SetTunnelPorts(ports []uint16) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.iso.tunnelPorts = slices.Clone(ports)
	d.dirty.iso = true
	return d.flush()
}

// setNodeIsolation takes a snapshot's policies; callers hold mu. The
// invalid ones are returned (the others apply).
func (d *Datapath) setNodeIsolation(pols []*coordinov1alpha1.NodeIsolationPolicy) error {
	d.iso.policies = pols
	d.dirty.iso = true
	_, err := nodeiso.Compile(pols, nil)
	if err != nil {
		return fmt.Errorf("nftables datapath: node isolation: %w", err)
	}
	return nil
}

// isRemoteNode reports whether a is another node's; callers hold mu.
func (d *Datapath) isRemoteNode(a netip.Addr) bool { return slices.Contains(d.iso.remoteNodes, a) }

// writeNodeIso brings node isolation's sets and chains in line with the
// policies, by element differences; the first flush of a run replaces the
// sets' content in its transaction (an adopted table's stays in force
// until then).
func (d *Datapath) writeNodeIso(t *txn) {
	if !d.dirty.iso && !d.dirty.all {
		return
	}
	first := d.iso.elems == nil
	rules, _ := nodeiso.Compile(d.iso.policies, d.iso.tunnelPorts)
	byGroup := map[group][]policy.Key{}
	for _, k := range rules.Keys {
		g := group{local: k.Local, remote: k.Remote, dir: k.Dir}
		byGroup[g] = append(byGroup[g], k)
	}
	want := map[string]map[isoElem]struct{}{}
	for _, s := range isoSets {
		want[s.name] = isoElems(s.g, byGroup[s.g])
	}
	wantNodes := map[netip.Addr]struct{}{}
	for _, a := range d.iso.remoteNodes {
		wantNodes[a] = struct{}{}
	}
	if first {
		for _, name := range []string{setNodes4, setNodes6, setIsoPodHost, setIsoPodNode, setIsoNode} {
			s := d.lay.sets[name]
			t.ops++
			t.pre = append(t.pre, func(c *nftables.Conn) error { c.FlushSet(s); return nil })
		}
	}
	for _, s := range isoSets {
		var add, del []nftables.SetElement
		for e := range d.iso.elems[s.name] {
			if _, ok := want[s.name][e]; !ok {
				del = append(del, e.setElement())
			}
		}
		for e := range want[s.name] {
			if _, ok := d.iso.elems[s.name][e]; !ok || first {
				add = append(add, e.setElement())
			}
		}
		t.elems(d.lay.sets[s.name], true, del)
		t.elems(d.lay.sets[s.name], false, add)
	}
	nodeSet := func(a netip.Addr) *nftables.Set {
		if a.Is4() {
			return d.lay.sets[setNodes4]
		}
		return d.lay.sets[setNodes6]
	}
	for a := range d.iso.nodes {
		if _, ok := wantNodes[a]; !ok {
			t.elems(nodeSet(a), true, []nftables.SetElement{{Key: a.AsSlice()}})
		}
	}
	for a := range wantNodes {
		if _, ok := d.iso.nodes[a]; !ok || first {
			t.elems(nodeSet(a), false, []nftables.SetElement{{Key: a.AsSlice()}})
		}
	}
	if first || rules.PodToHost != d.iso.podToHost {
		var content [][]expr.Any
		if rules.PodToHost {
			content = isoPodRules()
		}
		t.rewrite(d.lay.isoChains[chainIsoPod], content)
	}
	if first || rules.NodeToNode != d.iso.nodeToNode {
		var content [][]expr.Any
		if rules.NodeToNode {
			content = isoNodeRules()
		}
		t.rewrite(d.lay.isoChains[chainIsoNode], content)
	}
	t.commit = append(t.commit, func() {
		d.iso.elems, d.iso.nodes = want, wantNodes
		d.iso.podToHost, d.iso.nodeToNode = rules.PodToHost, rules.NodeToNode
	})
}
