package wireguard

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/coordino/coordino/daemon/peers"
)

// PublishedKey is the public key peers must use for this node: the pending
// one during a rotation.
func (d *Device) PublishedKey() wgtypes.Key {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.next != nil {
		return d.next.PublicKey()
	}
	return d.key.PublicKey()
}

// Rotate prepares a key rotation (see PrepareRotation); the device switches
// once the peer set carries the new public key for this node.
func (d *Device) Rotate() (wgtypes.Key, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rotateLocked()
}

func (d *Device) rotateLocked() (wgtypes.Key, error) {
	if d.next != nil {
		return d.next.PublicKey(), nil
	}
	k, err := PrepareRotation(d.cfg.StateDir)
	if err != nil {
		return wgtypes.Key{}, fmt.Errorf("prepare wireguard key rotation: %w", err)
	}
	d.next = &k
	pub := k.PublicKey()
	d.log.Info("wireguard key rotation prepared: the device switches once peers are given the new public key",
		zap.String("nextPublicKey", pub.String()), zap.String("publicKeyFile", filepath.Join(d.cfg.StateDir, PublicKeyFile)))
	if d.cfg.OnPublicKey != nil {
		d.cfg.OnPublicKey(pub)
	}
	if d.last != nil {
		// The peer set may already carry it (a pending rotation found at start).
		if err := d.switchAndApply(d.last); err != nil {
			return pub, err
		}
	}
	return pub, nil
}

// checkRotation starts a rotation when asked to (trigger file) or when the
// key is older than KeyMaxAge.
func (d *Device) checkRotation() {
	trigger := filepath.Join(d.cfg.StateDir, RotateTriggerFile)
	_, err := os.Stat(trigger)
	requested := err == nil
	aged := false
	if d.cfg.KeyMaxAge > 0 {
		if fi, err := os.Stat(filepath.Join(d.cfg.StateDir, PrivateKeyFile)); err == nil {
			aged = time.Since(fi.ModTime()) > d.cfg.KeyMaxAge
		}
	}
	if !requested && !aged {
		return
	}
	d.mu.Lock()
	_, err = d.rotateLocked()
	d.mu.Unlock()
	if err != nil {
		d.log.Error("wireguard key rotation", zap.Error(err))
		return
	}
	if requested {
		if err := os.Remove(trigger); err != nil && !errors.Is(err, fs.ErrNotExist) {
			d.log.Warn("remove wireguard rotation trigger", zap.Error(err))
		}
	}
}

// maybeSwitchKey switches the device to the pending key once set lists it
// for this node, and reports whether it did: the same peer set tells every
// other node, so they replace this node's peer at the same time and the
// tunnels re-handshake at once.
func (d *Device) maybeSwitchKey(set peers.Set) (bool, error) {
	if d.next == nil {
		return false, nil
	}
	self := set[d.cfg.Self]
	if self == nil || self.WireGuard == nil || self.WireGuard.PublicKey != d.next.PublicKey().String() {
		return false, nil
	}
	next := *d.next
	// Only the private key is set. The kernel and wireguard-go alike then
	// keep every peer (endpoint, allowed IPs, replay and flood state),
	// recompute each peer's static-static secret, expire the sessions of
	// the old key and clear the 5 s limit on initiations, so the next
	// packet to a peer initiates a handshake at once under the new key.
	// Re-creating the peers instead (ReplacePeers) left the device without
	// them for a moment: an initiation arriving then was dropped as
	// invalid, and its sender tried again only a second or more later.
	if err := d.client.ConfigureDevice(d.cfg.Device, wgtypes.Config{PrivateKey: &next}); err != nil {
		return false, fmt.Errorf("switch %s to the rotated key: %w", d.cfg.Device, err)
	}
	d.key, d.next = next, nil
	if err := CommitRotation(d.cfg.StateDir); err != nil {
		// The device runs the new key; at restart the old one would be set
		// again and the rotation stay pending: say so, do not pretend.
		return true, fmt.Errorf("store the rotated wireguard key: %w", err)
	}
	d.log.Info("wireguard key rotated", zap.String("publicKey", next.PublicKey().String()))
	return true, nil
}

// Settling after peers change. A peer this device did not have (or all of
// them, after this node's key changed or its device was re-created) is
// given a persistent keepalive until its first handshake: WireGuard sends a
// keepalive as soon as one is switched on, so the tunnel comes up when it is
// configured rather than on the first packet, and a re-created device
// re-handshakes with peers that still hold sessions with the device it
// replaces (they would wait 10 s for a reply, then 5 s more).
//
// Of each pair of nodes, the end with the lower public key initiates: when
// both ends initiate at the same moment, each takes the other's initiation
// as responder and neither completes, and WireGuard only retries after 5 s.
// The higher end switches its keepalive on only if no handshake came within
// settleHigherAfter (its peer may hold a stale session and wait). Should
// both still meet (traffic makes either end initiate), the lower end
// re-creates its peer, which lets it initiate again at once, after
// settleKick and then at doubling intervals: a handshake slower than the
// interval (a loaded machine) is not cut short again and again.
const (
	settleFor         = 8 * time.Second
	settleInterval    = 250 * time.Millisecond
	settleKick        = time.Second
	settleHigherAfter = 2 * time.Second
	// settleKeepalive is the keepalive of a settling peer, switched off
	// once it has handshaken or settleFor has passed.
	settleKeepalive = time.Second
)

// settle brings up the peers whose keys (or this node's key) changed at
// since, and watches them until each has handshaken or settleFor passes.
func (d *Device) settle(changed map[wgtypes.Key]bool, since time.Time) {
	primed := map[wgtypes.Key]bool{}
	defer func() {
		d.mu.Lock()
		d.setKeepalive(primed, 0)
		d.mu.Unlock()
	}()
	kicked, kickWait := since, settleKick
	pending := len(changed)
	for pass := 0; time.Since(since) < settleFor; pass++ {
		if pass > 0 {
			time.Sleep(settleInterval)
		}
		d.mu.Lock()
		dev, err := d.client.Device(d.cfg.Device)
		if err != nil {
			d.mu.Unlock()
			return
		}
		own := d.key.PublicKey()
		var kick wgtypes.Config
		prime, done := map[wgtypes.Key]bool{}, map[wgtypes.Key]bool{}
		pending = 0
		for _, p := range dev.Peers {
			k := p.PublicKey
			if !changed[k] {
				continue
			}
			if p.LastHandshakeTime.After(since) {
				if primed[k] {
					done[k] = true
				}
				continue
			}
			pending++
			lower := bytesLess(own[:], k[:])
			switch {
			case !primed[k] && (lower || time.Since(since) >= settleHigherAfter):
				prime[k] = true
			case primed[k] && lower && time.Since(kicked) >= kickWait:
				kick.Peers = append(kick.Peers,
					wgtypes.PeerConfig{PublicKey: k, Remove: true},
					wgtypes.PeerConfig{PublicKey: k, Endpoint: p.Endpoint, ReplaceAllowedIPs: true, AllowedIPs: p.AllowedIPs,
						PersistentKeepaliveInterval: ptr(settleKeepalive)})
			}
		}
		d.setKeepalive(prime, settleKeepalive)
		d.setKeepalive(done, 0)
		maps.Copy(primed, prime)
		maps.DeleteFunc(primed, func(k wgtypes.Key, _ bool) bool { return done[k] })
		if len(kick.Peers) > 0 {
			kicked, kickWait = time.Now(), 2*kickWait
			d.log.Debug("re-creating wireguard peers without a handshake", zap.Int("peers", len(kick.Peers)/2))
			if err := d.client.ConfigureDevice(d.cfg.Device, kick); err != nil {
				d.log.Warn("could not re-create wireguard peers without a handshake", zap.Error(err))
			}
		}
		d.mu.Unlock()
		if pending == 0 {
			return
		}
	}
	d.log.Warn("wireguard peers still without a handshake: left to WireGuard's own retries",
		zap.Int("peers", pending), zap.Duration("after", settleFor))
}

// setKeepalive sets the persistent keepalive of the peers keys; callers
// hold mu. Switching it on makes WireGuard send one (and so initiate a
// handshake) at once.
func (d *Device) setKeepalive(keys map[wgtypes.Key]bool, every time.Duration) {
	var c wgtypes.Config
	for k := range keys {
		c.Peers = append(c.Peers, wgtypes.PeerConfig{PublicKey: k, UpdateOnly: true, PersistentKeepaliveInterval: &every})
	}
	if len(c.Peers) == 0 {
		return
	}
	if err := d.client.ConfigureDevice(d.cfg.Device, c); err != nil {
		d.log.Warn("set the keepalive of settling wireguard peers", zap.Duration("every", every), zap.Error(err))
	}
}

func ptr[T any](v T) *T { return &v }

func bytesLess(a, b []byte) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

// freshPeers are the peers just added with a key the device did not have,
// or all of them after this node's own key changed (rekeyed).
func freshPeers(have map[wgtypes.Key]wgtypes.Peer, configured []wgtypes.PeerConfig, rekeyed bool) map[wgtypes.Key]bool {
	fresh := map[wgtypes.Key]bool{}
	for _, pc := range configured {
		if _, ok := have[pc.PublicKey]; (!ok || rekeyed) && !pc.Remove {
			fresh[pc.PublicKey] = true
		}
	}
	if rekeyed {
		for k := range have {
			fresh[k] = true
		}
		for _, pc := range configured {
			if pc.Remove {
				delete(fresh, pc.PublicKey)
			}
		}
	}
	return fresh
}
