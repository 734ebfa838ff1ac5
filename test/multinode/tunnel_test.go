package multinode

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/coordino/coordino/bpf"
	"github.com/coordino/coordino/daemon/routing"
	"github.com/coordino/coordino/test/harness"
)

// TestVXLANTunnelInterop: the eBPF tunnel speaks the VXLAN device's wire
// format. node1 runs --host-routing=legacy, so the kernel's device
// encapsulates and decapsulates everything on its side while node0's
// programs do it on theirs: pods and nodes reach each other both ways in
// both families, an 8 MiB echo (GSO packets encapsulated by the program)
// and full-size datagrams cross intact, node0's tunnel counters move both
// ways and node1 redirects nothing.
func TestVXLANTunnelInterop(t *testing.T) {
	c := newClusterWith(t, vxlan, 2, func(dir string) []string {
		if filepath.Base(dir) == "node1" {
			return []string{"--host-routing", "legacy"}
		}
		return nil
	})
	addServingPods(t, c)
	before := hostRouteStats(t, c.nodes[0])
	t.Run("reachability", func(t *testing.T) { checkReachability(t, c) })
	t.Run("large-transfer", func(t *testing.T) { checkLargeTransfer(t, c) })
	t.Run("full-size-datagrams", func(t *testing.T) { checkFullSizeDatagrams(t, c) })
	after := hostRouteStats(t, c.nodes[0])
	for _, stat := range []bpf.CoordinoHostrouteStat{bpf.CoordinoHostrouteStatHR_STAT_ENCAPSULATED, bpf.CoordinoHostrouteStatHR_STAT_DECAPSULATED} {
		if got := statDelta(before, after, stat); got < 20 {
			t.Errorf("node0: tunnel counter %d moved by %d packets, want >= 20", stat, got)
		}
	}
	s := hostRouteStats(t, c.nodes[1])
	if in, out := s[bpf.CoordinoHostrouteStatHR_STAT_IN_REDIRECTED], s[bpf.CoordinoHostrouteStatHR_STAT_OUT_REDIRECTED]; in+out != 0 {
		t.Errorf("node1: %d packets redirected in, %d out under --host-routing=legacy", in, out)
	}
}

// TestVXLANInjection: a VXLAN frame is judged by the packet inside it, so
// whoever may hand the VXLAN device a frame may pose as any pod. node1's
// pod v accepts UDP only from node0's pod trusted (and does: the control).
// The same datagram from trusted's address, wrapped in VXLAN to node1's
// port, reaches v when a peer node sends it (the frame is well formed) and
// is dropped as tunnel-injection when a pod sends it, to another node's
// address (egress of node0's pod) or to its own node's (egress of node1's
// pod), or when a host on the underlay that is no peer node does (node1's
// underlay ingress).
func TestVXLANInjection(t *testing.T) {
	c := newClusterWith(t, vxlan, 2, benchPolicyArgs(t))
	trusted, attacker := c.addPod(c.nodes[0]), c.addPod(c.nodes[0])
	v, localAttacker := c.addPod(c.nodes[1]), c.addPod(c.nodes[1])
	const port = 7070
	got := receiveUDP(t, v, port)
	pol := []byte(fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-trusted, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: %s/32}}]
    ports: [{protocol: UDP, port: %d}]
`, trusted.addr(false), port))
	if err := c.nodes[1].WritePolicy(filepath.Join(c.nodes[1].Dir, "policies"), "only-trusted.yaml", pol, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	node1 := c.nodes[1].address(false)
	vtepMAC := vxlanDeviceMAC(t, c.nodes[1])
	frame := func(msg string) []byte {
		return vxlanFrame(vtepMAC, trusted.addr(false), v.addr(false), port, []byte(msg))
	}
	// A stranger on the underlay: the underlay namespace itself, with an
	// address no peers file lists.
	if err := c.underlay.Do(func(ns.NetNS) error {
		br, err := netlink.LinkByName(c.bridge)
		if err != nil {
			return err
		}
		return netlink.AddrAdd(br, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("192.0.2.200"), Mask: net.CIDRMask(24, 32)}})
	}); err != nil {
		t.Fatal(err)
	}
	send := func(from ns.NetNS, to netip.Addr, port int, payload []byte) {
		t.Helper()
		conn, err := harness.DialFrom(from, "udp", to, port, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for range 3 { // UDP: a lost datagram must not pass for a dropped one
			_, _ = conn.Write(payload)
		}
	}
	// Messages v may receive (each is sent three times).
	legit := map[string]bool{}
	expect := func(want string) {
		t.Helper()
		legit[want] = true
		deadline := time.After(5 * time.Second)
		for {
			select {
			case m := <-got:
				if m == want {
					return
				}
				if !legit[m] {
					t.Errorf("v received %q while waiting for %q", m, want)
				}
			case <-deadline:
				t.Fatalf("v did not receive %q", want)
			}
		}
	}
	injected := func(n *node, direction string) float64 {
		x, err := n.Metric("coordino_datapath_packets_total", `direction="`+direction+`"`, `reason="tunnel-injection"`)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}

	send(trusted.NS, v.addr(false), port, []byte("from trusted"))
	expect("from trusted")
	send(c.nodes[0].NS, node1, routing.DefaultVXLANPort, frame("via peer node"))
	expect("via peer node")

	before0, before1, beforeIn := injected(c.nodes[0], "egress"), injected(c.nodes[1], "egress"), injected(c.nodes[1], "ingress")
	send(attacker.NS, v.addr(false), port, []byte("attacker, plain"))
	send(attacker.NS, node1, routing.DefaultVXLANPort, frame("pod to another node's port"))
	send(localAttacker.NS, node1, routing.DefaultVXLANPort, frame("pod to its own node's port"))
	send(c.underlay, node1, routing.DefaultVXLANPort, frame("stranger on the underlay"))
	for quiet := time.After(2 * time.Second); ; {
		select {
		case m := <-got:
			if !legit[m] {
				t.Errorf("v received %q, which only trusted may send", m)
			}
			continue
		case <-quiet:
		}
		break
	}
	for _, check := range []struct {
		what string
		got  float64
	}{
		{"node0 egress (pod to another node's port)", injected(c.nodes[0], "egress") - before0},
		{"node1 egress (pod to its own node's port)", injected(c.nodes[1], "egress") - before1},
		{"node1 ingress (stranger on the underlay)", injected(c.nodes[1], "ingress") - beforeIn},
	} {
		if check.got < 1 {
			t.Errorf("%s: tunnel-injection drops moved by %v, want >= 1", check.what, check.got)
		}
	}
}

// receiveUDP returns the datagrams p receives on port (IPv4).
func receiveUDP(t *testing.T, p *pod, port int) <-chan string {
	t.Helper()
	var conn net.PacketConn
	if err := p.NS.Do(func(ns.NetNS) error {
		var err error
		conn, err = net.ListenPacket("udp4", netip.AddrPortFrom(p.addr(false), uint16(port)).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	out := make(chan string, 64)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			select {
			case out <- string(buf[:n]):
			default:
			}
		}
	}()
	return out
}

// vxlanDeviceMAC is n's VXLAN device MAC: inner frames must be addressed
// to it for the device to take them.
func vxlanDeviceMAC(t *testing.T, n *node) net.HardwareAddr {
	t.Helper()
	return linkAttrs(t, n.NS, routing.DefaultVXLANDevice).HardwareAddr
}

// vxlanFrame is the UDP payload of a VXLAN packet (VNI 1) carrying an
// Ethernet frame to mac with an IPv4 UDP datagram from src to dst:port.
func vxlanFrame(mac net.HardwareAddr, src, dst netip.Addr, port int, payload []byte) []byte {
	b := []byte{0x08, 0, 0, 0, 0, 0, 1, 0} // the I flag; VNI 1
	b = append(b, mac...)
	b = append(b, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00) // any source MAC; IPv4
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	copy(ip[12:], src.AsSlice())
	copy(ip[16:], dst.AsSlice())
	binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip))
	udp := make([]byte, 8) // checksum 0: none, as IPv4 allows
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], uint16(port))
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	return append(append(append(b, ip...), udp...), payload...)
}

func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i < len(h); i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
