package bgp

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

func TestParseFileDefaultsAndFields(t *testing.T) {
	c, err := ParseFile([]byte(`
localASN: 64512
peers:
- address: 192.0.2.254
  asn: 65000
- address: "2001:db8::fe"
  asn: 65000
  port: 1179
  holdTimeSeconds: 9
  families: [IPv6]
  maxPrefixes: 5
  passwordFile: /x
`), func(p coordinov1alpha1.BGPPeer) (string, error) { return "s3cret", nil })
	if err != nil {
		t.Fatal(err)
	}
	if c.LocalASN != 64512 || c.ListenPort != DefaultPort || c.RestartTime != DefaultRestartTime || len(c.Peers) != 2 {
		t.Fatalf("%+v", c)
	}
	a, b := c.Peers[0], c.Peers[1]
	if a.Port != 179 || a.HoldTime != 90*time.Second || a.Keepalive != 30*time.Second || !a.IPv4 || !a.IPv6 || a.MaxPrefixes != DefaultMaxPrefixes || a.Password != "" {
		t.Errorf("defaults: %+v", a)
	}
	if b.Address != netip.MustParseAddr("2001:db8::fe") || b.Port != 1179 || b.HoldTime != 9*time.Second || b.Keepalive != 3*time.Second || b.IPv4 || !b.IPv6 || b.MaxPrefixes != 5 || b.Password != "s3cret" {
		t.Errorf("fields: %+v", b)
	}
}

func TestParseFileErrorsNameTheField(t *testing.T) {
	peer := "peers:\n- address: 192.0.2.1\n  asn: 65000\n"
	for _, c := range []struct{ doc, want string }{
		{"localASN: 0\n" + peer, "localASN"},
		{"localASN: 65535\n" + peer, "localASN"},
		{"localASN: 64512\n", "peers"},
		{"localASN: 64512\nlistenPort: 70000\n" + peer, "listenPort"},
		{"localASN: 64512\nrestartTimeSeconds: 5000\n" + peer, "restartTimeSeconds"},
		{"localASN: 64512\npeers:\n- address: nope\n  asn: 1\n", "peers[0]: address"},
		{"localASN: 64512\npeers:\n- address: 192.0.2.1\n  asn: 4294967295\n", "peers[0]: asn"},
		{"localASN: 64512\npeers:\n- address: 192.0.2.1\n  asn: 1\n  holdTimeSeconds: 2\n", "holdTimeSeconds"},
		{"localASN: 64512\npeers:\n- address: 192.0.2.1\n  asn: 1\n  holdTimeSeconds: 9\n  keepaliveSeconds: 4\n", "keepaliveSeconds"},
		{"localASN: 64512\npeers:\n- address: 192.0.2.1\n  asn: 1\n  families: [IPX]\n", "families"},
		{"localASN: 64512\npeers:\n- address: 192.0.2.1\n  asn: 1\n  passwordSecretRef: {name: a, key: b}\n", "passwordSecretRef"},
		{"localASN: 64512\n" + peer + "- address: 192.0.2.1\n  asn: 2\n", "listed twice"},
		{"localASN: 64512\nbogus: 1\n" + peer, "bogus"},
	} {
		_, err := ParseFile([]byte(c.doc), readPasswordFile)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error naming %s", c.doc, err, c.want)
		}
	}
}

func TestPasswordNeverPrints(t *testing.T) {
	p := Peer{Address: netip.MustParseAddr("192.0.2.1"), Password: "hunter2"}
	for _, s := range []string{fmt.Sprint(p), fmt.Sprintf("%+v", p), fmt.Sprintf("%#v", p), fmt.Sprint(p.Password)} {
		if strings.Contains(s, "hunter2") {
			t.Errorf("password printed: %s", s)
		}
	}
}

func TestGuard(t *testing.T) {
	g := Guard{
		Blocks:    []netip.Prefix{netip.MustParsePrefix("10.10.0.0/24"), netip.MustParsePrefix("fd00:10::/64")},
		Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")},
		Services:  []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
		Encrypted: []netip.Prefix{netip.MustParsePrefix("10.10.2.0/24")},
	}
	nh := netip.MustParseAddr("192.0.2.254")
	for _, c := range []struct {
		dst    string
		nh     netip.Addr
		reject bool
	}{
		{"10.10.1.0/24", nh, false},
		{"fd00:10:1::/64", netip.MustParseAddr("2001:db8::fe"), false},
		{"10.10.0.0/24", nh, true},   // this node's block
		{"10.10.0.128/25", nh, true}, // inside it
		{"10.0.0.0/8", nh, true},     // covering it
		{"fd00::/16", netip.MustParseAddr("2001:db8::fe"), true},
		{"192.0.2.0/24", nh, true}, // the node's address
		{"10.100.0.0/16", nh, true},
		{"0.0.0.0/0", nh, true},
		{"10.10.1.0/24", netip.MustParseAddr("192.0.2.1"), true}, // via itself
		{"10.10.1.0/24", netip.Addr{}, true},
		{"10.10.1.0/24", netip.MustParseAddr("127.0.0.1"), true},
		{"10.10.2.0/24", nh, true},  // WireGuard carries it
		{"10.10.2.64/26", nh, true}, // inside that
		{"10.10.3.0/24", nh, false}, // beside it
	} {
		why := g.Reject(netip.MustParsePrefix(c.dst), c.nh)
		if (why != "") != c.reject {
			t.Errorf("%s via %v: reject %q, want reject=%v", c.dst, c.nh, why, c.reject)
		}
	}
}

// FuzzParseFile: any bytes give a config or an error, never a panic, and
// an accepted config holds only valid values.
func FuzzParseFile(f *testing.F) {
	f.Add([]byte("localASN: 64512\npeers:\n- address: 192.0.2.1\n  asn: 65000\n  families: [IPv4]\n"))
	f.Add([]byte(`{"localASN":1,"peers":[{"address":"::1","asn":2,"holdTimeSeconds":3}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseFile(data, func(coordinov1alpha1.BGPPeer) (string, error) { return "x", nil })
		if err != nil {
			return
		}
		if c.LocalASN == 0 || len(c.Peers) == 0 || c.RestartTime <= 0 {
			t.Fatalf("accepted %+v", c)
		}
		for _, p := range c.Peers {
			if !p.Address.IsValid() || p.Port == 0 || p.HoldTime < 3*time.Second || p.Keepalive <= 0 || p.Keepalive > p.HoldTime/3 || !(p.IPv4 || p.IPv6) || p.MaxPrefixes == 0 {
				t.Fatalf("accepted peer %+v", p)
			}
		}
	})
}
