package policy

import (
	"github.com/coordino/coordino/api/policyir"
	"github.com/coordino/coordino/daemon/identity"
)

// Prefix lengths of policy keys, counted over local(32) remote(32) dir(8)
// proto(8) port(16); they match POLICY_PREFIX_* in bpf/coordino.h.
const (
	PrefixAnyProto = 72
	PrefixProto    = 80
	PrefixFull     = 96
)

// Key is one entry of the BPF policy LPM trie. Bits past Prefix are zero.
type Key struct {
	Prefix uint32
	Local  identity.ID
	Remote identity.ID
	Dir    Direction
	Proto  uint8
	Port   uint16
}

// Keys expands r into LPM keys: one for all protocols or all ports, else the
// aligned power-of-two port blocks that exactly cover [PortLo, PortHi].
func (r Rule) Keys() []Key {
	base := Key{Local: r.Local, Remote: r.Remote, Dir: r.Dir}
	if r.Tier == policyir.TierBaseline {
		base.Dir |= DirBaseline
	}
	if r.Proto == ProtoAny {
		base.Prefix = PrefixAnyProto
		return []Key{base}
	}
	base.Proto = r.Proto
	if r.PortLo == 0 && r.PortHi == 65535 {
		base.Prefix = PrefixProto
		return []Key{base}
	}
	var out []Key
	for lo, hi := uint32(r.PortLo), uint32(r.PortHi); lo <= hi; {
		// Largest block aligned at lo that does not pass hi.
		size := uint32(1)
		for bits := 16; bits > 0 && lo%(size*2) == 0 && lo+size*2-1 <= hi; bits-- {
			size *= 2
		}
		k := base
		k.Port = uint16(lo)
		k.Prefix = PrefixFull - uint32(log2(size))
		out = append(out, k)
		lo += size
	}
	return out
}

func log2(n uint32) int {
	b := 0
	for n > 1 {
		n >>= 1
		b++
	}
	return b
}

// Table is a set of policy keys with the lookup semantics of the kernel's
// LPM trie; the datapath mirrors it into the BPF map and tests query it.
type Table map[Key]struct{}

// Table expands all rules of r.
func (r *Result) Table() Table {
	t := Table{}
	for _, rule := range r.Rules {
		if rule.Tier != policyir.TierNetworkPolicy {
			continue // Table holds NetworkPolicy allows only
		}
		for _, k := range rule.Keys() {
			t[k] = struct{}{}
		}
	}
	return t
}

// Match reports whether some key covers (local, remote, dir, proto, port),
// as one kernel LPM lookup with a full-length key would.
func (t Table) Match(local, remote identity.ID, dir Direction, proto uint8, port uint16) bool {
	k := Key{Prefix: PrefixAnyProto, Local: local, Remote: remote, Dir: dir}
	if _, ok := t[k]; ok {
		return true
	}
	k.Proto = proto
	for bits := 0; bits <= 16; bits++ {
		k.Prefix = PrefixProto + uint32(bits)
		k.Port = port &^ (0xffff >> bits)
		if _, ok := t[k]; ok {
			return true
		}
	}
	return false
}

// Flow is a new connection as the datapath sees it at one endpoint.
type Flow struct {
	Local      identity.ID
	Isolation  Isolation
	Dir        Direction
	Remote     identity.ID // pod or host identity, or the CIDR identity
	RemoteCIDR identity.ID // CIDR identity of the remote address
	Proto      uint8
	Port       uint16 // destination port of the connection
}

// Allowed decides a new flow exactly as the BPF program does: traffic from
// the node is allowed, a direction no policy isolates is open, and otherwise
// a rule must match the remote identity, its CIDR identity or any remote.
func (t Table) Allowed(f Flow) bool {
	if f.Dir == Ingress && f.Remote == identity.Host {
		return true
	}
	if !f.Isolation.Has(f.Dir) {
		return true
	}
	port := f.Port
	if f.Proto != ProtoTCP && f.Proto != ProtoUDP && f.Proto != ProtoSCTP {
		port = 0
	}
	return t.Match(f.Local, f.Remote, f.Dir, f.Proto, port) ||
		(f.RemoteCIDR != f.Remote && t.Match(f.Local, f.RemoteCIDR, f.Dir, f.Proto, port)) ||
		t.Match(f.Local, identity.Any, f.Dir, f.Proto, port)
}
