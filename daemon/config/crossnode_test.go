package config

import (
	"io"
	"strings"
	"testing"
)

func TestCrossNodeFlags(t *testing.T) {
	o, err := Parse([]string{"--routing", "vxlan", "--encryption", "wireguard", "--peers-file", "/etc/coordino/peers.yaml", "--wireguard-device", "wg-a", "--wireguard-port", "51999", "--wireguard-node-to-node=false", "--host-routing", "legacy", "--wireguard-device-kind", "kernel"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Routing != "vxlan" || o.Encryption != "wireguard" || o.PeersFile != "/etc/coordino/peers.yaml" || o.WireGuardDevice != "wg-a" || o.WireGuardPort != 51999 || o.WireGuardNodeToNode || o.HostRouting != "legacy" || o.WireGuardDeviceKind != "kernel" {
		t.Fatalf("parsed %+v", o)
	}
	// BGP with WireGuard: the fabric learns the blocks, pod traffic to
	// other nodes goes encrypted.
	if _, err := Parse([]string{"--routing", "bgp", "--bgp-config", "/etc/coordino/bgp.yaml", "--encryption", "wireguard"}, io.Discard); err != nil {
		t.Errorf("bgp with wireguard: %v", err)
	}
	b, err := Parse([]string{"--routing", "bgp", "--bgp-config", "/etc/coordino/bgp.yaml"}, io.Discard)
	if err != nil || b.Routing != "bgp" || b.BGPConfig != "/etc/coordino/bgp.yaml" {
		t.Fatalf("bgp: %+v, %v", b, err)
	}
	d, err := Parse(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.Routing != "direct" || d.Encryption != "none" || d.WireGuardDevice != "coordino-wg" || !d.WireGuardNodeToNode || d.HostRouting != "bpf" || d.WireGuardDeviceKind != "auto" {
		t.Fatalf("defaults %+v", d)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--routing", "ospf"}, "routing"},
		{[]string{"--standalone", "--pod-cidr", "10.0.0.0/24", "--routing", "bgp"}, "bgp-config"},
		{[]string{"--routing", "bgp", "--bgp-config", "bgp.yaml"}, "bgp-config"},
		{[]string{"--encryption", "ipsec"}, "encryption"},
		{[]string{"--peers-file", "peers.yaml"}, "peers-file"},
		{[]string{"--wireguard-device", "a-name-longer-than-15"}, "wireguard-device"},
		{[]string{"--wireguard-device", "../x"}, "wireguard-device"},
		{[]string{"--wireguard-port", "0"}, "wireguard-port"},
		{[]string{"--host-routing", "fast"}, "host-routing"},
		{[]string{"--wireguard-device-kind", "tun"}, "wireguard-device-kind"},
	} {
		if _, err := Parse(c.args, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: got %v, want an error naming %s", c.args, err, c.want)
		}
	}
}
