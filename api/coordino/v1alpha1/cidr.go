package v1alpha1

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
)

// ParseCIDR parses a CIDR field of a Coordino object. It accepts only the
// canonical form the CRD schema demands (host bits zero, no IPv4-mapped IPv6,
// no zone), so a value the API server let through and one a client sends
// before validation are read the same way.
func ParseCIDR(field, s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s: %q is not a CIDR", field, s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%s: %q is an IPv4-mapped IPv6 CIDR; write it as IPv4", field, s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%s: %q has host bits set (did you mean %s?)", field, s, p.Masked())
	}
	return p, nil
}

// BlockSize returns the pool's block prefix length for an address family,
// applying the defaults when the field is unset.
func (s *IPPoolSpec) BlockSize(ipv6 bool) int {
	if ipv6 {
		if s.BlockSizeIPv6 == 0 {
			return DefaultBlockSizeIPv6
		}
		return int(s.BlockSizeIPv6)
	}
	if s.BlockSizeIPv4 == 0 {
		return DefaultBlockSizeIPv4
	}
	return int(s.BlockSizeIPv4)
}

// Prefixes parses and checks the pool's CIDRs against its block sizes: each
// CIDR must hold at least one block, block sizes must be in range, and no two
// CIDRs may overlap.
func (s *IPPoolSpec) Prefixes() ([]netip.Prefix, error) {
	if b := s.BlockSize(false); b < 16 || b > 30 {
		return nil, fmt.Errorf("spec.blockSizeIPv4: %d is outside 16..30", b)
	}
	if b := s.BlockSize(true); b < 64 || b > 126 {
		return nil, fmt.Errorf("spec.blockSizeIPv6: %d is outside 64..126", b)
	}
	if len(s.CIDRs) == 0 {
		return nil, fmt.Errorf("spec.cidrs: empty")
	}
	out := make([]netip.Prefix, 0, len(s.CIDRs))
	for i, c := range s.CIDRs {
		field := fmt.Sprintf("spec.cidrs[%d]", i)
		p, err := ParseCIDR(field, c)
		if err != nil {
			return nil, err
		}
		if bs := s.BlockSize(p.Addr().Is6()); p.Bits() > bs {
			return nil, fmt.Errorf("%s: %s is smaller than one /%d block", field, c, bs)
		}
		for j, q := range out {
			if q.Overlaps(p) {
				return nil, fmt.Errorf("%s: %s overlaps spec.cidrs[%d] %s", field, c, j, q)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// Prefixes parses the node's blocks; an unparsable or duplicate entry is an
// error naming it.
func (s *NodeConfigSpec) Prefixes() ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(s.Blocks))
	for i, b := range s.Blocks {
		p, err := ParseCIDR(fmt.Sprintf("spec.blocks[%d].cidr", i), b.CIDR)
		if err != nil {
			return nil, err
		}
		for j, q := range out {
			if q.Overlaps(p) {
				return nil, fmt.Errorf("spec.blocks[%d].cidr: %s overlaps spec.blocks[%d] %s", i, b.CIDR, j, q)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// BlockName is the IPBlock object name of a block: "10.244.1.64-26" for
// IPv4, the full address as eight dot-separated hex groups for IPv6
// ("fd00.0010.0244.0000.0000.0000.0000.0040-122"). It is injective and a
// valid object name for every prefix.
func BlockName(p netip.Prefix) string {
	a := p.Addr()
	if a.Is4() {
		return fmt.Sprintf("%s-%d", a, p.Bits())
	}
	b := a.As16()
	h := hex.EncodeToString(b[:])
	var sb strings.Builder
	for i := 0; i < 32; i += 4 {
		if i > 0 {
			sb.WriteByte('.')
		}
		sb.WriteString(h[i : i+4])
	}
	fmt.Fprintf(&sb, "-%d", p.Bits())
	return sb.String()
}
