package nftdp

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/policy"
)

func TestCIDRRangesAreTheLongestPrefixMatch(t *testing.T) {
	p := netip.MustParsePrefix
	prefixes := map[netip.Prefix]identity.ID{
		p("10.0.0.0/8"): 1, p("10.1.0.0/16"): 2, p("10.1.2.0/24"): 3, p("10.255.0.0/16"): 4,
		p("0.0.0.0/0"): 5, p("2001:db8::/32"): 6, p("2001:db8::/64"): 7,
	}
	got := cidrRanges(prefixes)
	// Every address resolves to exactly one range, of the identity of its
	// longest prefix.
	for _, s := range []string{"10.0.0.0", "10.1.0.0", "10.1.2.7", "10.1.3.0", "10.254.255.255", "10.255.1.1",
		"11.0.0.0", "0.0.0.0", "255.255.255.255", "9.255.255.255", "2001:db8::1", "2001:db8:0:1::", "2001:db9::"} {
		a := netip.MustParseAddr(s)
		want, bits := identity.ID(0), -1
		for pf, id := range prefixes {
			if pf.Contains(a) && pf.Bits() > bits {
				want, bits = id, pf.Bits()
			}
		}
		var found []identity.ID
		for r, id := range got {
			if r.lo.Is4() == a.Is4() && !a.Less(r.lo) && !r.hi.Less(a) {
				found = append(found, id)
			}
		}
		if want == 0 && len(found) != 0 || want != 0 && !reflect.DeepEqual(found, []identity.ID{want}) {
			t.Errorf("%s: in ranges of %v, want only %d", a, found, want)
		}
	}
}

func TestGroupElemsMergeNestedPortBlocks(t *testing.T) {
	g := group{local: 300, remote: 301, dir: policy.Ingress}
	var keys []policy.Key
	for _, r := range []policy.Rule{
		{Proto: policy.ProtoTCP, PortLo: 80, PortHi: 80}, {Proto: policy.ProtoTCP, PortLo: 64, PortHi: 127},
		{Proto: policy.ProtoTCP, PortLo: 128, PortHi: 130}, {Proto: policy.ProtoUDP, PortLo: 53, PortHi: 53},
	} {
		r.Local, r.Remote = g.local, g.remote
		keys = append(keys, r.Keys()...)
	}
	want := []allowElem{
		{local: 300, remote: 301, protoLo: policy.ProtoTCP, protoHi: policy.ProtoTCP, portLo: 64, portHi: 130},
		{local: 300, remote: 301, protoLo: policy.ProtoUDP, protoHi: policy.ProtoUDP, portLo: 53, portHi: 53},
	}
	if got := groupElems(g, keys); !reflect.DeepEqual(got, want) {
		t.Errorf("groupElems = %+v, want %+v", got, want)
	}
	keys = append(keys, policy.Rule{Local: 300, Remote: 301, Proto: policy.ProtoAny, PortHi: 65535}.Keys()...)
	if got := groupElems(g, keys); len(got) != 1 || got[0].protoLo != 0 || got[0].protoHi != 255 {
		t.Errorf("with an all-protocols key: %+v, want one element for everything", got)
	}
}
