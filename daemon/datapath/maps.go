package datapath

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

// ipcacheKey converts a prefix to the LPM key: 32 family bits, then address.
func ipcacheKey(p netip.Prefix) bpf.CoordinoIpcacheKey {
	p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked()
	k := bpf.CoordinoIpcacheKey{Prefixlen: uint32(32 + p.Bits())}
	if p.Addr().Is4() {
		k.Family = 4
		a := p.Addr().As4()
		copy(k.Addr[:], a[:])
	} else {
		k.Family = 6
		k.Addr = p.Addr().As16()
	}
	return k
}

// prefixOf converts an ipcache key back to a prefix.
func prefixOf(k bpf.CoordinoIpcacheKey) (netip.Prefix, error) {
	switch {
	case k.Family == 4 && k.Prefixlen >= 32 && k.Prefixlen <= 64:
		return netip.PrefixFrom(netip.AddrFrom4([4]byte(k.Addr[:4])), int(k.Prefixlen-32)), nil
	case k.Family == 6 && k.Prefixlen >= 32 && k.Prefixlen <= 160:
		return netip.PrefixFrom(netip.AddrFrom16(k.Addr), int(k.Prefixlen-32)), nil
	}
	return netip.Prefix{}, fmt.Errorf("invalid ipcache key family %d prefixlen %d", k.Family, k.Prefixlen)
}

// policyKey converts a compiled key; the port is stored in network order so
// its leading bits form the LPM prefix.
func policyKey(k policy.Key) bpf.CoordinoPolicyKey {
	return bpf.CoordinoPolicyKey{
		Prefixlen: k.Prefix,
		LocalId:   uint32(k.Local),
		RemoteId:  uint32(k.Remote),
		Dir:       uint8(k.Dir),
		Proto:     k.Proto,
		Port:      bits.ReverseBytes16(k.Port),
	}
}

func fromPolicyKey(k bpf.CoordinoPolicyKey) policy.Key {
	return policy.Key{
		Prefix: k.Prefixlen,
		Local:  identity.ID(k.LocalId),
		Remote: identity.ID(k.RemoteId),
		Dir:    policy.Direction(k.Dir),
		Proto:  k.Proto,
		Port:   bits.ReverseBytes16(k.Port),
	}
}

// ntohs converts a port read from a BPF struct in network order.
func ntohs(v uint16) uint16 { return bits.ReverseBytes16(v) }

// htons converts a port for a BPF struct in network order.
func htons(v uint16) uint16 { return bits.ReverseBytes16(v) }

// mirrors hold what the daemon believes each map contains, so a sync writes
// only differences.
type mirrors struct {
	policy    map[policy.Key]policy.Value
	ipcache   map[netip.Prefix]bpf.CoordinoIpcacheValue
	endpoints map[uint32]bpf.CoordinoEndpointInfo
}

func readMirrors(maps writerMaps) (*mirrors, error) {
	m := &mirrors{
		policy:    map[policy.Key]policy.Value{},
		ipcache:   map[netip.Prefix]bpf.CoordinoIpcacheValue{},
		endpoints: map[uint32]bpf.CoordinoEndpointInfo{},
	}
	var (
		pk bpf.CoordinoPolicyKey
		pv bpf.CoordinoPolicyValue
	)
	it := maps.policy.Iterate()
	for it.Next(&pk, &pv) {
		m.policy[fromPolicyKey(pk)] = policy.Value(pv.Flags)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("datapath: read policy map: %w", err)
	}
	var (
		ik bpf.CoordinoIpcacheKey
		iv bpf.CoordinoIpcacheValue
	)
	it = maps.ipcache.Iterate()
	for it.Next(&ik, &iv) {
		p, err := prefixOf(ik)
		if err != nil {
			return nil, fmt.Errorf("datapath: read ipcache: %w", err)
		}
		m.ipcache[p] = iv
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("datapath: read ipcache: %w", err)
	}
	var (
		ek uint32
		ev bpf.CoordinoEndpointInfo
	)
	it = maps.endpoints.Iterate()
	for it.Next(&ek, &ev) {
		m.endpoints[ek] = ev
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("datapath: read endpoints map: %w", err)
	}
	return m, nil
}

func deleteKey(m *ebpf.Map, k any) error {
	if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}
