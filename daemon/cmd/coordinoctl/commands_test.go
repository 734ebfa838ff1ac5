package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
)

type statusDaemon struct {
	inspectv1.UnimplementedInspectorServer
	st *inspectv1.Status
}

func (d statusDaemon) GetStatus(context.Context, *inspectv1.GetStatusRequest) (*inspectv1.Status, error) {
	return d.st, nil
}

// status shows the cross-node datapath with handshake ages, the kernel
// feature table (what a missing feature costs), and why an IPv6 /64 has
// 65,536 addresses.
// status in bgp routing shows each session (state, prefix counts, why it
// is down) and no peer list: the fabric, not a peer set, brings the blocks.
func TestStatusShowsBGPSessions(t *testing.T) {
	st := &inspectv1.Status{NodeName: "n1", Mode: "standalone", CrossNode: &inspectv1.CrossNode{Routing: "bgp", Encryption: "none",
		BgpNeighbors: []*inspectv1.BGPNeighbor{
			{Address: "192.0.2.254", Asn: 65000, State: "Established", Received: 4, Accepted: 3, Sent: 1},
			{Address: "192.0.2.200", Asn: 65001, State: "Active", Problem: "bad peer AS"},
		}}}
	sock := serveGRPC(t, func(g *grpc.Server) { inspectv1.RegisterInspectorServer(g, statusDaemon{st: st}) })
	code, out, stderr, _ := runTimed("status", "--socket", sock)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, re := range []string{
		`(?m)^Cross-node:\s+routing bgp, encryption none$`,
		`(?m)^BGP:\s+192\.0\.2\.254  AS 65000  Established  4 received, 3 accepted, 1 sent$`,
		`(?m)^\s+192\.0\.2\.200  AS 65001  Active  0 received, 0 accepted, 0 sent  \(bad peer AS\)$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("no line matching %s in:\n%s", re, out)
		}
	}
	if strings.Contains(out, "Peers:") {
		t.Errorf("bgp routing lists a peer set:\n%s", out)
	}
}

func TestStatusShowsCrossNodeKernelFeaturesAndBlockCap(t *testing.T) {
	st := &inspectv1.Status{
		NodeName: "n1", Mode: "standalone", Verdict: "degraded", AttachMode: "tcx",
		Blocks: []*inspectv1.Block{{Cidr: "10.1.0.0/24", Size: 254, Used: 3, Free: 251}, {Cidr: "fd00:1::/64", Size: 65536, Used: 3, Free: 65533}},
		CrossNode: &inspectv1.CrossNode{Routing: "wireguard", Encryption: "wireguard", WireguardDevice: "userspace", PublicKey: "xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=",
			Peers: []*inspectv1.Peer{
				{Name: "n2", Addresses: []string{"192.168.0.2"}, Blocks: []string{"10.1.1.0/24"}, Endpoint: "192.168.0.2:51871",
					LastHandshakeUnix: time.Now().Add(-42 * time.Second).Unix(), RxBytes: 1000, TxBytes: 2000},
				{Name: "n3", Addresses: []string{"192.168.0.3"}, Problem: "no WireGuard key published yet: its pods are unreachable"},
			}},
		Masquerade: &inspectv1.Masquerade{Enabled: true, Sources: []string{"10.1.0.0/24"}, ServiceCidrs: []string{"10.96.0.0/12"},
			ConnectionsIpv4: 12, ConnectionsIpv6: 3, ConntrackInsertFailed: 2},
		KernelFeatures: []*inspectv1.KernelFeature{
			{Name: "tcx", Available: true, Detail: "kernel 6.18"},
			{Name: "wireguard", Available: false, Detail: "no module", Effect: "userspace device (coordino-wireguard)"},
		},
	}
	sock := serveGRPC(t, func(g *grpc.Server) { inspectv1.RegisterInspectorServer(g, statusDaemon{st: st}) })
	code, out, stderr, _ := runTimed("status", "--socket", sock)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, re := range []string{
		`(?m)^Cross-node:\s+routing wireguard, encryption wireguard$`,
		`(?m)^WireGuard:\s+userspace device, public key xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=$`,
		`(?m)^Peers:\s+n2  192\.168\.0\.2  blocks 10\.1\.1\.0/24  handshake 4[1-4]s ago \(endpoint 192\.168\.0\.2:51871, 1000 B in, 2000 B out\)$`,
		`(?m)^\s+n3  192\.168\.0\.3  blocks -  No WireGuard key published yet: its pods are unreachable$`,
		`(?m)^Masquerade:\s+on: 12 IPv4, 3 IPv6 connections; conntrack insert failures 2, drops 0$`,
		`(?m)^\s+sources 10\.1\.0\.0/24$`,
		`(?m)^\s+Service ranges 10\.96\.0\.0/12$`,
		`(?m)^\s+non-masquerade -$`,
		`(?m)^Kernel features:\s+tcx\s+yes\s+kernel 6\.18$`,
		`(?m)^\s+wireguard\s+no\s+no module\s+userspace device \(coordino-wireguard\)$`,
		`(?m)fd00:1::/64  3/65536 used \(0\.0%\), 65533 free \(a block hands out its first 65,536 addresses only\)$`,
		`(?m)10\.1\.0\.0/24  3/254 used \(1\.2%\), 251 free$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("status lacks %s:\n%s", re, out)
		}
	}
	code, out, stderr, _ = runTimed("status", "-o", "json", "--socket", sock)
	if code != 0 || !strings.Contains(out, `"kernelFeatures": [`) || !strings.Contains(out, `"effect": "userspace device (coordino-wireguard)"`) ||
		!strings.Contains(out, `"lastHandshakeUnix": `) {
		t.Fatalf("status -o json: exit %d %s\n%s", code, stderr, out)
	}
}
