package bgp

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// A speaker with peers on loopback ports nobody listens on (no traffic
// leaves the machine), not listening itself.
func testSpeaker(t *testing.T, peers ...Peer) *Speaker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Start(ctx, Config{LocalASN: 64512, ListenPort: -1, RestartTime: time.Minute, Peers: peers}, "n1", t.TempDir(), netip.MustParseAddr("127.0.0.1"), zap.NewNop())
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop(); cancel() })
	return s
}

func loopbackPeer(last byte, asn uint32) Peer {
	return Peer{Address: netip.AddrFrom4([4]byte{127, 0, 0, last}), ASN: asn, Port: 1, HoldTime: 9 * time.Second, Keepalive: 3 * time.Second, IPv4: true, MaxPrefixes: 10}
}

func neighborAddrs(t *testing.T, s *Speaker) []string {
	t.Helper()
	ns, err := s.Neighbors(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range ns {
		if n.State == "Established" {
			t.Errorf("%s established with nobody listening", n.Address)
		}
		out = append(out, n.Address.String())
	}
	return out
}

func TestConfigureAddsRemovesAndRefusesIdentityChanges(t *testing.T) {
	a, b, c := loopbackPeer(2, 65000), loopbackPeer(3, 65000), loopbackPeer(4, 65001)
	s := testSpeaker(t, a, b)
	if got := neighborAddrs(t, s); !slices.Equal(got, []string{"127.0.0.2", "127.0.0.3"}) {
		t.Fatalf("started with %v", got)
	}
	b2 := b
	b2.HoldTime, b2.Keepalive = 30*time.Second, 10*time.Second
	if err := s.Configure(context.Background(), Config{LocalASN: 64512, ListenPort: -1, RestartTime: time.Minute, Peers: []Peer{b2, c}}); err != nil {
		t.Fatal(err)
	}
	if got := neighborAddrs(t, s); !slices.Equal(got, []string{"127.0.0.3", "127.0.0.4"}) {
		t.Fatalf("after Configure: %v", got)
	}
	err := s.Configure(context.Background(), Config{LocalASN: 64513, ListenPort: -1, RestartTime: time.Minute, Peers: []Peer{c}})
	if err == nil || !strings.Contains(err.Error(), "localASN") {
		t.Fatalf("ASN change: %v, want an error naming localASN", err)
	}
	if got := neighborAddrs(t, s); !slices.Equal(got, []string{"127.0.0.3", "127.0.0.4"}) {
		t.Errorf("a refused Configure changed the peers: %v", got)
	}
}
