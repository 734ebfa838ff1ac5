package nftdp

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// regConcat starts the registers of a concatenated key (NFT_REG32_00):
// each field in the next 32-bit registers, as nft lays them out.
const regConcat = 8

// family is one address family as the rules load it.
type family struct {
	nfproto              byte
	addrLen              uint32
	srcOffset, dstOffset uint32
	v6                   bool
	host, src            string
}

var families = []family{
	{nfproto: unix.NFPROTO_IPV4, addrLen: 4, srcOffset: 12, dstOffset: 16, host: setHost4, src: setSrc4},
	{nfproto: unix.NFPROTO_IPV6, addrLen: 16, srcOffset: 8, dstOffset: 24, v6: true, host: setHost6, src: setSrc6},
}

func (f family) match() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f.nfproto}},
	}
}

// loadPeer loads the address of the packet's peer in direction dir: the
// source of what reaches the pod, the destination of what it sends.
func (f family) loadPeer(dir policy.Direction, reg uint32) expr.Any {
	off := f.srcOffset
	if dir == policy.Egress {
		off = f.dstOffset
	}
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: f.addrLen}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

// peerRules send a packet of an isolated endpoint with identity local
// to the chains of the identity pairs its peer belongs to: the peer's own
// identity (pods map), the CIDR identity of its address (cidrs map), and
// any remote. A rule allowing the packet accepts it there, else the next
// one is asked, as the eBPF programs ask their policy map.
func peerRules(dir policy.Direction, local identity.ID) [][]expr.Any {
	var out [][]expr.Any
	for _, f := range families {
		e := f.match()
		out = append(out, append(e, f.loadPeer(dir, 1),
			&expr.Lookup{SourceRegister: 1, SetName: podsSet(local, dir, f.v6), DestRegister: 0, IsDestRegSet: true}))
	}
	for _, f := range families {
		e := f.match()
		out = append(out, append(e, f.loadPeer(dir, regConcat),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regConcat + f.addrLen/4},
			&expr.Lookup{SourceRegister: regConcat, SetName: cidrsSet(local, dir, f.v6), DestRegister: 0, IsDestRegSet: true}))
	}
	return append(out, []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: pairChain(group{local: local, remote: identity.Any, dir: dir})}})
}

// pairSetMin is the number of port blocks above which a pair's chain
// looks them up in sets of its rules instead of one rule each: every
// packet of a connection's opening direction walks the chain, and a
// policy may list thousands of ports.
const pairSetMin = 4

// pairRules queues on c the content of an identity pair's chain: what its
// merged elements allow. Beyond pairSetMin port blocks, single ports are
// one lookup in a hashed anonymous set of protocol . port, and ranges
// (when there are more than pairSetMin of them too) one in an interval
// set; the kernel creates them with their rule in the same transaction
// and removes them with it.
func pairRules(c *nftables.Conn, t *nftables.Table, elems []allowElem) ([][]expr.Any, error) {
	var out [][]expr.Any
	var singles, ranges []allowElem
	for _, el := range elems {
		switch {
		case el.protoLo != el.protoHi:
			return [][]expr.Any{{verdict(expr.VerdictAccept)}}, nil
		case !portProto(el.protoLo):
		case el.portLo == el.portHi:
			singles = append(singles, el)
		default:
			ranges = append(ranges, el)
		}
	}
	inSet := func(el allowElem) bool {
		if !portProto(el.protoLo) || len(singles)+len(ranges) <= pairSetMin {
			return false
		}
		return el.portLo == el.portHi || len(ranges) > pairSetMin
	}
	for _, el := range elems {
		if inSet(el) {
			continue
		}
		if e, ok := elemMatch(el); ok {
			out = append(out, append(e, verdict(expr.VerdictAccept)))
		}
	}
	for _, set := range [][]allowElem{singles, ranges} {
		if len(set) == 0 || !inSet(set[0]) {
			continue
		}
		r, err := portSetRule(c, t, set)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// portSetRule queues an anonymous set of elems' protocol . port blocks
// (hashed when they are single ports) and returns the rule accepting what
// it holds.
func portSetRule(c *nftables.Conn, t *nftables.Table, elems []allowElem) ([]expr.Any, error) {
	interval := elems[0].portLo != elems[0].portHi
	set := &nftables.Set{Table: t, Anonymous: true, Constant: true, Interval: interval, Concatenation: true, KeyType: typeProtoPort}
	es := make([]nftables.SetElement, 0, len(elems))
	for _, el := range elems {
		e := isoElem{protoLo: el.protoLo, protoHi: el.protoHi, portLo: el.portLo, portHi: el.portHi}.setElement()
		if !interval {
			e.KeyEnd = nil
		}
		es = append(es, e)
	}
	if err := c.AddSet(set, es); err != nil {
		return nil, fmt.Errorf("ports set of a pair's chain: %w", err)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regConcat},
		&expr.Payload{DestRegister: regConcat + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: regConcat, SetName: set.Name, SetID: set.ID},
		verdict(expr.VerdictAccept),
	}, nil
}

// elemMatch matches the packets of one element: nothing to match for
// every protocol; port protocols match their destination port, others
// have port 0, as the eBPF programs key them (ok is false for a port
// block of such a protocol that does not hold 0: it matches nothing).
func elemMatch(el allowElem) (_ []expr.Any, ok bool) {
	if el.protoLo != el.protoHi {
		return nil, true
	}
	e := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{el.protoLo}},
	}
	switch {
	case !portProto(el.protoLo):
		if el.portLo != 0 {
			return nil, false
		}
	case el.portLo == 0 && el.portHi == 65535:
	case el.portLo == el.portHi:
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, el.portLo)})
	default:
		e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: binary.BigEndian.AppendUint16(nil, el.portLo),
				ToData: binary.BigEndian.AppendUint16(nil, el.portHi)})
	}
	return e, true
}

// Endpoint chains. Allowed traffic is accepted, which ends only the hook
// chain it came through (the other direction's chain, kube-proxy's and
// others' still judge it); denied traffic is counted and dropped.

// trackedRules let through replies of tracked connections and related
// packets (ICMP errors): their connection was allowed when it began, and
// every packet of the opening direction is judged by the policy in force,
// so a revoked rule cuts existing connections as it does in eBPF mode.
func trackedRules() [][]expr.Any {
	return [][]expr.Any{
		{
			&expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1}}, // IP_CT_DIR_REPLY
			verdict(expr.VerdictAccept),
		},
		{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitRELATED), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
			verdict(expr.VerdictAccept),
		},
	}
}

// spoofRules drop what the pod with identity local sends from an address
// not its own on its interface (reporting it); IPv6 neighbour discovery
// from link-local or unspecified sources (the gateway's, never forwarded)
// passes.
func spoofRules(local identity.ID) [][]expr.Any {
	var out [][]expr.Any
	v6 := families[1]
	linkLocal := make([]byte, 16)
	linkLocal[0], linkLocal[1] = 0xfe, 0x80
	mask := make([]byte, 16)
	mask[0], mask[1] = 0xff, 0xc0
	for _, pfx := range []struct{ addr, mask []byte }{
		{addr: linkLocal, mask: mask}, // fe80::/10
		{addr: make([]byte, 16)},      // ::
	} {
		e := v6.match()
		e = append(e, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{133}, ToData: []byte{137}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: v6.srcOffset, Len: 16})
		if pfx.mask != nil {
			e = append(e, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 16, Mask: pfx.mask, Xor: make([]byte, 16)})
		}
		e = append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: pfx.addr})
		out = append(out, append(e, verdict(expr.VerdictAccept)))
	}
	for _, f := range families {
		e := append(f.match(), &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: regConcat},
			&expr.Payload{DestRegister: regConcat + 4, Base: expr.PayloadBaseNetworkHeader, Offset: f.srcOffset, Len: f.addrLen},
			&expr.Lookup{SourceRegister: regConcat, SetName: f.src, Invert: true})
		out = append(out, dropRules(e, logPrefix{dir: policy.Egress, reason: "spoofed", local: local}, dropsSpoofed)...)
	}
	return out
}

// dropRules drop, count and report what match selects: a first rule logs
// it within the flow log limits (past them it falls through unreported),
// the second counts and drops it.
func dropRules(match []expr.Any, pfx logPrefix, counter string) [][]expr.Any {
	logged := append(slices.Clone(match),
		&expr.Limit{Type: expr.LimitTypePkts, Rate: dropLogEndpointRate, Unit: expr.LimitTimeSecond, Burst: dropLogEndpointBurst},
		&expr.Objref{Type: unix.NFT_OBJECT_LIMIT, Name: limitDropLog},
		logTo(pfx))
	return [][]expr.Any{logged, append(slices.Clone(match), countDrop(counter), verdict(expr.VerdictDrop))}
}

// logTo hands the packet to the flow log group with prefix pfx.
func logTo(pfx logPrefix) expr.Any {
	return &expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN,
		Group: FlowLogGroup, Snaplen: flowSnaplen, Data: []byte(pfx.String())}
}

// allowedRules are the content of the allowed-flow chains while allowed
// flows are wanted: a new connection that reaches them passed the pod's
// chains (drops are final), and is reported within its own limit.
func allowedRules(hook string) [][]expr.Any {
	newFlow := []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
	var out [][]expr.Any
	for _, dir := range []policy.Direction{policy.Egress, policy.Ingress} {
		if hook == chainAllowedIn && dir == policy.Ingress {
			continue // to the node: only the sender is a pod
		}
		if hook == chainAllowedOut && dir == policy.Egress {
			continue // from the node: only the receiver is a pod
		}
		out = append(out, append(slices.Clone(newFlow), dispatchKey(dir),
			&expr.Lookup{SourceRegister: 1, SetName: setPodIfs},
			&expr.Objref{Type: unix.NFT_OBJECT_LIMIT, Name: limitAllowedLog},
			logTo(logPrefix{dir: dir, reason: reasonAllowed})))
	}
	return out
}

// hostRules let everything from this node's addresses reach the pod
// (kubelet probes), as in eBPF mode.
func hostRules() [][]expr.Any {
	var out [][]expr.Any
	for _, f := range families {
		e := f.match()
		out = append(out, append(e, f.loadPeer(policy.Ingress, 1),
			&expr.Lookup{SourceRegister: 1, SetName: f.host}, verdict(expr.VerdictAccept)))
	}
	return out
}

// endpointRules is the whole content of an endpoint's chain for dir, in
// the order of policy.Decide: the Admin tier's chain (its Accept and Deny
// final, Pass and no match returning here), NetworkPolicy when it
// isolates dir, else the Baseline tier's chain, then allow.
func endpointRules(dir policy.Direction, local identity.ID, iso policy.Isolation) [][]expr.Any {
	var out [][]expr.Any
	if dir == policy.Egress {
		out = append(out, spoofRules(local)...)
	}
	out = append(out, trackedRules()...)
	if dir == policy.Ingress {
		out = append(out, hostRules()...)
	}
	tiered := iso.Tiered(dir)
	if tiered {
		out = append(out, jumpTier(tierUnit{local: local, dir: dir}))
	}
	if !iso.Has(dir) {
		if tiered {
			out = append(out, jumpTier(tierUnit{local: local, dir: dir | policy.DirBaseline}))
		}
		return append(out, []expr.Any{verdict(expr.VerdictAccept)})
	}
	out = append(out, peerRules(dir, local)...)
	established := []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
	out = append(out, dropRules(established, logPrefix{dir: dir, reason: reasonRevoked, local: local}, dropCounter(dir, reasonRevoked))...)
	return append(out, dropRules(nil, logPrefix{dir: dir, reason: reasonDenied, local: local}, dropCounter(dir, reasonDenied))...)
}

// dispatchRule is the content of a hook chain: the chain of the pod
// interface the packet leaves (egress) or enters (ingress) through.
func dispatchRule(dir policy.Direction) []expr.Any {
	return []expr.Any{
		dispatchKey(dir),
		&expr.Lookup{SourceRegister: 1, SetName: epsSet(dir), DestRegister: 0, IsDestRegSet: true},
	}
}

// dispatchKey loads the pod interface of dir into register 1: the one
// the packet leaves (egress) or enters (ingress) through.
func dispatchKey(dir policy.Direction) expr.Any {
	if dir == policy.Egress {
		return &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}
	}
	return &expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}
}

// countDrop counts a packet in the named counter of the table.
func countDrop(counter string) expr.Any {
	return &expr.Objref{Type: unix.NFT_OBJECT_COUNTER, Name: counter}
}
