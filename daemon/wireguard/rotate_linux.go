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
		if err := d.maybeSwitchKey(d.last); err != nil {
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
// for this node: the same peer set tells every other node, so they replace
// this node's peer at the same time and the tunnels re-handshake at once.
func (d *Device) maybeSwitchKey(set peers.Set) error {
	if d.next == nil {
		return nil
	}
	self := set[d.cfg.Self]
	if self == nil || self.WireGuard == nil || self.WireGuard.PublicKey != d.next.PublicKey().String() {
		return nil
	}
	next := *d.next
	// The peers are re-created with the key: sessions die with the old key
	// anyway, and fresh peers may initiate a handshake at once, where a
	// peer that sent one in the last 5 s (e.g. rejected by a node that had
	// not switched yet) would wait that long.
	dev, err := d.client.Device(d.cfg.Device)
	if err != nil {
		return fmt.Errorf("wireguard %s: %w", d.cfg.Device, err)
	}
	c := wgtypes.Config{PrivateKey: &next, ReplacePeers: true}
	for _, p := range dev.Peers {
		c.Peers = append(c.Peers, wgtypes.PeerConfig{PublicKey: p.PublicKey, Endpoint: p.Endpoint,
			ReplaceAllowedIPs: true, AllowedIPs: p.AllowedIPs})
	}
	if err := d.client.ConfigureDevice(d.cfg.Device, c); err != nil {
		return fmt.Errorf("switch %s to the rotated key: %w", d.cfg.Device, err)
	}
	if err := CommitRotation(d.cfg.StateDir); err != nil {
		// The device runs the new key; at restart the old one would be set
		// again and the rotation stay pending: say so, do not pretend.
		return fmt.Errorf("store the rotated wireguard key: %w", err)
	}
	d.key, d.next, d.switched = next, nil, true
	d.log.Info("wireguard key rotated", zap.String("publicKey", next.PublicKey().String()))
	return nil
}

// Settling after key changes. A peer this device did not have (or all of
// them, after this node's key changed or its device was re-created) is
// given a persistent keepalive until its first handshake: WireGuard sends a
// keepalive as soon as one is switched on, so the tunnel comes up when it is
// configured rather than on the first packet, and a re-created device
// re-handshakes at once with peers that still hold sessions with the
// device it replaces (they would wait 10 s for a reply, then 5 s more).
// When both ends initiate at the same moment, each takes the other's
// initiation as responder and neither completes: WireGuard only retries
// after 5 s. Of each such pair, the end with the lower public key re-creates
// its peer once a second until a handshake completes, so it initiates again
// alone.
const (
	settleFor      = 8 * time.Second
	settleInterval = 250 * time.Millisecond
	settleKick     = time.Second
	// settleKeepalive is the keepalive of a settling peer, switched off
	// once it has handshaken or settleFor has passed.
	settleKeepalive = time.Second
)

// settle brings up the peers whose keys (or this node's key) changed at
// since, and watches them until each has handshaken or settleFor passes.
func (d *Device) settle(changed map[wgtypes.Key]bool, since time.Time) {
	keepalive := func(keys map[wgtypes.Key]bool, every time.Duration) {
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
	primed := maps.Clone(changed)
	d.mu.Lock()
	keepalive(primed, settleKeepalive)
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		keepalive(primed, 0)
		d.mu.Unlock()
	}()
	kicked := since
	pending := len(changed)
	for time.Since(since) < settleFor {
		time.Sleep(settleInterval)
		d.mu.Lock()
		dev, err := d.client.Device(d.cfg.Device)
		if err != nil {
			d.mu.Unlock()
			return
		}
		own := d.key.PublicKey()
		var kick wgtypes.Config
		done := map[wgtypes.Key]bool{}
		pending = 0
		for _, p := range dev.Peers {
			if !changed[p.PublicKey] {
				continue
			}
			if p.LastHandshakeTime.After(since) {
				if primed[p.PublicKey] {
					done[p.PublicKey] = true
				}
				continue
			}
			pending++
			if time.Since(kicked) >= settleKick && bytesLess(own[:], p.PublicKey[:]) {
				kick.Peers = append(kick.Peers,
					wgtypes.PeerConfig{PublicKey: p.PublicKey, Remove: true},
					wgtypes.PeerConfig{PublicKey: p.PublicKey, Endpoint: p.Endpoint, ReplaceAllowedIPs: true, AllowedIPs: p.AllowedIPs,
						PersistentKeepaliveInterval: ptr(settleKeepalive)})
			}
		}
		keepalive(done, 0)
		maps.DeleteFunc(primed, func(k wgtypes.Key, _ bool) bool { return done[k] })
		if len(kick.Peers) > 0 {
			kicked = time.Now()
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
// or all of them after this node's own key changed (switched marks it).
func (d *Device) freshPeers(have map[wgtypes.Key]wgtypes.Peer, configured []wgtypes.PeerConfig) map[wgtypes.Key]bool {
	fresh := map[wgtypes.Key]bool{}
	for _, pc := range configured {
		if _, ok := have[pc.PublicKey]; !ok && !pc.Remove {
			fresh[pc.PublicKey] = true
		}
	}
	if d.switched {
		d.switched = false
		for k := range have {
			fresh[k] = true
		}
		for _, pc := range configured {
			if !pc.Remove {
				fresh[pc.PublicKey] = true
			}
		}
	}
	return fresh
}
