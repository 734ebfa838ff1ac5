package config

import (
	"fmt"
	"path/filepath"
)

func (o *Options) validateCrossNode() error {
	if o.Routing != "direct" && o.Routing != "vxlan" && o.Routing != "bgp" {
		return fmt.Errorf("routing %q: want direct, vxlan or bgp", o.Routing)
	}
	if o.Encryption != "none" && o.Encryption != "wireguard" {
		return fmt.Errorf("encryption %q: want none or wireguard", o.Encryption)
	}
	if o.Routing == "bgp" && o.Standalone && o.BGPConfig == "" {
		return fmt.Errorf("bgp-config: routing bgp in standalone mode needs the speaker's file (Kubernetes mode reads BGPPeerPolicies)")
	}
	if o.BGPConfig != "" && !filepath.IsAbs(o.BGPConfig) {
		return fmt.Errorf("bgp-config %q must be an absolute path", o.BGPConfig)
	}
	if o.PeersFile != "" && !filepath.IsAbs(o.PeersFile) {
		return fmt.Errorf("peers-file %q must be an absolute path", o.PeersFile)
	}
	// IFNAMSIZ-1, and the UAPI socket path is built from it.
	if n := o.WireGuardDevice; n == "" || len(n) > 15 || filepath.Base(n) != n || n == "." || n == ".." {
		return fmt.Errorf("wireguard-device %q: want an interface name of 1..15 characters", n)
	}
	if o.WireGuardPort < 1 || o.WireGuardPort > 65535 {
		return fmt.Errorf("wireguard-port %d: want 1..65535", o.WireGuardPort)
	}
	if k := o.WireGuardDeviceKind; k != "auto" && k != "kernel" && k != "userspace" && k != "external" {
		return fmt.Errorf("wireguard-device-kind %q: want auto, kernel, userspace or external", k)
	}
	if o.HostRouting != "bpf" && o.HostRouting != "legacy" {
		return fmt.Errorf("host-routing %q: want bpf or legacy", o.HostRouting)
	}
	return nil
}
