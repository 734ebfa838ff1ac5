package peers

import (
	"net/netip"
	"strings"
	"testing"
)

const key = "uJPtWyodTMiO3yBRGWyS0JhkCZ4hmRVOgVatBSsD8Eo="

func TestParseFileRoundTrip(t *testing.T) {
	in := []byte(`nodes:
- name: a
  addresses: [192.0.2.1, "2001:db8::1"]
  blocks: [10.1.0.0/24, "fd00:1::/64"]
  wireGuard: {publicKey: "` + key + `", endpoint: "192.0.2.1:51871"}
- name: b
  addresses: ["2001:db8::2"]
  blocks: ["fd00:2::/64"]
`)
	s, err := ParseFile(in)
	if err != nil {
		t.Fatal(err)
	}
	a := s["a"]
	if a == nil || len(a.Addresses) != 2 || a.WireGuard == nil || a.WireGuard.Endpoint != netip.MustParseAddrPort("192.0.2.1:51871") {
		t.Fatalf("node a parsed as %+v", a)
	}
	if addr, ok := s["b"].Address(false); ok {
		t.Fatalf("node b has no IPv4 address, got %v", addr)
	}
	out, err := MarshalFile(s)
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseFile(out)
	if err != nil {
		t.Fatalf("re-parse %s: %v", out, err)
	}
	if !equalSets(s, again) {
		t.Fatalf("round trip changed the set:\n%s", out)
	}
}

func TestParseFileErrorsNameTheField(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{`nodes: [{name: a, addresses: [300.1.1.1]}]`, `("a"): addresses`},
		{`nodes: [{name: a, blocks: [10.1.0.1/24]}]`, "not a masked CIDR"},
		{`nodes: [{name: a, blocks: [0.0.0.0/0]}]`, "route everything"},
		{`nodes: [{name: a, addresses: [192.0.2.1, 192.0.2.2]}]`, "at most one IPv4"},
		{`nodes: [{name: a, addresses: [127.0.0.1]}]`, "not a routable"},
		{`nodes: [{name: a}, {name: a}]`, "listed twice"},
		{`nodes: [{name: a, blocks: [10.1.0.0/24]}, {name: b, blocks: [10.1.0.0/16]}]`, "overlap"},
		{`nodes: [{name: a, wireGuard: {publicKey: abc}}]`, "wireGuard.publicKey"},
		{`nodes: [{name: a, wireGuard: {publicKey: "` + key + `", endpoint: "192.0.2.1"}}]`, "wireGuard.endpoint"},
		{`nodes: [{name: "", blocks: []}]`, "node name"},
		{`nodes: [{name: a, colour: blue}]`, "unknown field"},
	} {
		_, err := ParseFile([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error containing %q", c.doc, err, c.want)
		}
	}
}

func FuzzParseFile(f *testing.F) {
	f.Add([]byte(`nodes: [{name: a, addresses: [192.0.2.1], blocks: [10.1.0.0/24]}]`))
	f.Add([]byte(`{"nodes":[{"name":"b","addresses":["2001:db8::2"],"blocks":["fd00:2::/64"],"wireGuard":{"publicKey":"` + key + `","endpoint":"[2001:db8::2]:51871"}}]}`))
	f.Add([]byte(`nodes: [{name: a, blocks: [10.1.0.0/24]}, {name: b, blocks: [10.1.0.0/16]}]`))
	f.Add([]byte("nodes:\n- name: x\n  addresses: [\"::ffff:1.2.3.4\"]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseFile(data)
		if err != nil {
			return
		}
		// Whatever parses must validate and survive a round trip unchanged.
		if err := s.Validate(); err != nil {
			t.Fatalf("parsed set fails validation: %v", err)
		}
		out, err := MarshalFile(s)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParseFile(out)
		if err != nil || !equalSets(s, again) {
			t.Fatalf("round trip: %v\n%s", err, out)
		}
	})
}

func TestOverlapFoundAmongManyBlocks(t *testing.T) {
	s := Set{}
	for i := 0; i < 200; i++ {
		name := "n" + netip.AddrFrom4([4]byte{10, byte(i), 0, 0}).String()
		s[name] = &Node{Name: name, Blocks: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 24)}}
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("disjoint blocks: %v", err)
	}
	// Nested two levels down from a neighbour in sort order.
	s["wide"] = &Node{Name: "wide", Blocks: []netip.Prefix{netip.MustParsePrefix("10.100.0.0/14")}}
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "overlap") {
		t.Fatalf("10.100.0.0/14 over 10.100-103.0.0/24: %v", err)
	}
}
