// Package wireguard encrypts traffic between nodes: it keeps the node's key
// pair (private key 0600 in the state dir, never logged), brings up one
// WireGuard device per node — the kernel's where the module exists, else
// the userspace coordino-wireguard process, which outlives daemon restarts;
// Config.Kind (--wireguard-device-kind) may insist on either —
// and configures it through wgctrl (netlink or the UAPI socket) from the
// peer set: each peer's blocks and node addresses as AllowedIPs, routes to
// peer blocks and (node-to-node) peer addresses onto the device.
package wireguard
