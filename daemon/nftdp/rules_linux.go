package nftdp

import (
	"encoding/binary"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// Registers of a policy lookup: the allow sets' key is local . remote .
// protocol . port in four consecutive 32-bit registers, the address being
// resolved sits after them.
const (
	regLocal  = 8 // NFT_REG32_00
	regRemote = 9
	regProto  = 10
	regPort   = 11
	regAddr   = 12 // 16 bytes for IPv6: 12-15
	regIfname = 8  // 16 bytes: 8-11, then the address at 12
)

// family is one address family as the rules load it.
type family struct {
	nfproto             byte
	addrLen             uint32
	srcOffset, dstOffset uint32
	ipcache, cidr, src  string
}

var families = []family{
	{nfproto: unix.NFPROTO_IPV4, addrLen: 4, srcOffset: 12, dstOffset: 16, ipcache: setIpcache4, cidr: setCIDR4, src: setSrc4},
	{nfproto: unix.NFPROTO_IPV6, addrLen: 16, srcOffset: 8, dstOffset: 24, ipcache: setIpcache6, cidr: setCIDR6, src: setSrc6},
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

// remoteSource is where a policy lookup takes the remote identity from:
// the peer's own identity, its CIDR identity, or any remote.
type remoteSource int

const (
	remotePod remoteSource = iota
	remoteCIDR
	remoteAny
)

// policyRule is one lookup of the allow set of dir for the endpoint's
// identity local: port protocols (TCP, UDP, SCTP) by destination port,
// others with port 0, as the eBPF programs key them.
func policyRule(f family, dir policy.Direction, local identity.ID, src remoteSource, ports bool) []expr.Any {
	e := f.match()
	e = append(e, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regProto},
		&expr.Lookup{SourceRegister: regProto, SetName: setPortProtos, Invert: !ports})
	if ports {
		e = append(e, &expr.Payload{DestRegister: regPort, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
	} else {
		e = append(e, &expr.Immediate{Register: regPort, Data: make([]byte, 4)})
	}
	e = append(e, &expr.Immediate{Register: regLocal, Data: idBytes(local)})
	switch src {
	case remotePod:
		e = append(e, f.loadPeer(dir, regAddr),
			&expr.Lookup{SourceRegister: regAddr, SetName: f.ipcache, DestRegister: regRemote, IsDestRegSet: true})
	case remoteCIDR:
		e = append(e, f.loadPeer(dir, regAddr),
			&expr.Immediate{Register: regAddr + f.addrLen/4, Data: make([]byte, 4)},
			&expr.Lookup{SourceRegister: regAddr, SetName: f.cidr, DestRegister: regRemote, IsDestRegSet: true})
	case remoteAny:
		e = append(e, &expr.Immediate{Register: regRemote, Data: idBytes(identity.Any)})
	}
	return append(e, &expr.Lookup{SourceRegister: regLocal, SetName: allowSet(dir)}, verdict(expr.VerdictReturn))
}

// Endpoint chains. Allowed traffic returns to the hook's chain (other
// stages still see it); denied traffic is counted and dropped.

// trackedRules let through replies of tracked connections and related
// packets (ICMP errors): their connection was allowed when it began, and
// every packet of the opening direction is judged by the policy in force,
// so a revoked rule cuts existing connections as it does in eBPF mode.
func trackedRules() [][]expr.Any {
	return [][]expr.Any{
		{
			&expr.Ct{Register: 1, Key: expr.CtKeyDIRECTION},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1}}, // IP_CT_DIR_REPLY
			verdict(expr.VerdictReturn),
		},
		{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitRELATED), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
			verdict(expr.VerdictReturn),
		},
	}
}

// spoofRules drop what the pod sends from an address not its own on
// interface ifname; IPv6 neighbour discovery from link-local or
// unspecified sources (the gateway's, never forwarded) passes.
func spoofRules() [][]expr.Any {
	var out [][]expr.Any
	v6 := families[1]
	for _, pfx := range []struct{ addr, mask []byte }{
		{addr: []byte{0xfe, 0x80}, mask: []byte{0xff, 0xc0}}, // fe80::/10
		{addr: make([]byte, 16), mask: nil},                 // ::
	} {
		e := v6.match()
		e = append(e, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: []byte{133}, ToData: []byte{137}})
		if pfx.mask != nil {
			e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: v6.srcOffset, Len: 2},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 2, Mask: pfx.mask, Xor: []byte{0, 0}},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: pfx.addr})
		} else {
			e = append(e, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: v6.srcOffset, Len: 16},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: pfx.addr})
		}
		out = append(out, append(e, verdict(expr.VerdictReturn)))
	}
	for _, f := range families {
		e := f.match()
		e = append(e, &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: regIfname},
			&expr.Payload{DestRegister: regAddr, Base: expr.PayloadBaseNetworkHeader, Offset: f.srcOffset, Len: f.addrLen},
			&expr.Lookup{SourceRegister: regIfname, SetName: f.src, Invert: true},
			&expr.Counter{}, verdict(expr.VerdictDrop))
		out = append(out, e)
	}
	return out
}

// hostRules let everything from this node's addresses reach the pod
// (kubelet probes), as in eBPF mode.
func hostRules() [][]expr.Any {
	var out [][]expr.Any
	for _, f := range families {
		e := f.match()
		e = append(e, f.loadPeer(policy.Ingress, regAddr),
			&expr.Lookup{SourceRegister: regAddr, SetName: f.ipcache, DestRegister: regRemote, IsDestRegSet: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: regRemote, Data: idBytes(identity.Host)},
			verdict(expr.VerdictReturn))
		out = append(out, e)
	}
	return out
}

// endpointRules is the whole content of an endpoint's chain for dir.
func endpointRules(dir policy.Direction, local identity.ID, iso policy.Isolation) [][]expr.Any {
	var out [][]expr.Any
	if dir == policy.Egress {
		out = append(out, spoofRules()...)
	}
	out = append(out, trackedRules()...)
	if dir == policy.Ingress {
		out = append(out, hostRules()...)
	}
	if !iso.Has(dir) {
		return append(out, []expr.Any{verdict(expr.VerdictReturn)})
	}
	for _, ports := range []bool{true, false} {
		for _, f := range families {
			for _, src := range []remoteSource{remotePod, remoteCIDR, remoteAny} {
				out = append(out, policyRule(f, dir, local, src, ports))
			}
		}
	}
	return append(out, []expr.Any{&expr.Counter{}, verdict(expr.VerdictDrop)})
}

// dispatchRules is the content of a hook chain: the packet's pod
// interfaces' chains, egress of the sender first.
func dispatchRules(hook *nftables.ChainHook) [][]expr.Any {
	out := [][]expr.Any{{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: epsSet(policy.Egress), DestRegister: 0, IsDestRegSet: true},
	}}
	if hook == nftables.ChainHookForward {
		out = append(out, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: epsSet(policy.Ingress), DestRegister: 0, IsDestRegSet: true},
		})
	}
	return out
}
