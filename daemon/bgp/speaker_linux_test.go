package bgp

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/api"
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

// The session carries the peer's families only, each with its prefix
// limit and graceful restart, the password, and the restart bit only when
// the speaker restarts.
func TestPeerRequest(t *testing.T) {
	p := loopbackPeer(2, 65000)
	p.IPv4, p.IPv6, p.MaxPrefixes, p.Password = false, true, 7, "pw"
	gr := &api.GracefulRestart{Enabled: true, RestartTime: 60}
	for _, restarting := range []bool{false, true} {
		r := peerRequest(p, gr, restarting)
		if len(r.AfiSafis) != 1 || r.AfiSafis[0].Config.Family.Afi != api.Family_AFI_IP6 {
			t.Fatalf("families %v, want IPv6 only", r.AfiSafis)
		}
		if l := r.AfiSafis[0].PrefixLimits; l == nil || l.MaxPrefixes != 7 {
			t.Errorf("prefix limit %v, want 7", l)
		}
		if !r.AfiSafis[0].MpGracefulRestart.Config.Enabled || !r.GracefulRestart.Enabled || r.GracefulRestart.RestartTime != 60 || r.GracefulRestart.LocalRestarting != restarting {
			t.Errorf("graceful restart %v (restarting %v)", r.GracefulRestart, restarting)
		}
		if r.Conf.AuthPassword != "pw" || r.Transport.RemotePort != 1 || r.Timers.Config.HoldTime != 9 {
			t.Errorf("conf %v transport %v timers %v", r.Conf, r.Transport, r.Timers)
		}
	}
}

// A learned path is routed via its next hop, through RTA_VIA when the next
// hop's family differs from the prefix's.
func TestKernelRoute(t *testing.T) {
	r := kernelRoute(learnedPath{dst: netip.MustParsePrefix("10.1.0.0/24"), nextHop: netip.MustParseAddr("192.0.2.254")})
	if r.Gw.String() != "192.0.2.254" || r.Via != nil || r.Dst.String() != "10.1.0.0/24" {
		t.Errorf("same family: %+v", r)
	}
	r = kernelRoute(learnedPath{dst: netip.MustParsePrefix("10.1.0.0/24"), nextHop: netip.MustParseAddr("2001:db8::fe")})
	if r.Gw != nil || r.Via == nil || !strings.Contains(r.Via.String(), "2001:db8::fe") {
		t.Errorf("IPv4 via IPv6: %+v", r)
	}
}
