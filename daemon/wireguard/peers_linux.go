package wireguard

import (
	"fmt"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// PeerState is a peer as the device holds it: public material only.
type PeerState struct {
	PublicKey wgtypes.Key
	// Endpoint is where the device sends to the peer, "" when unknown.
	Endpoint string
	// LastHandshake is zero until a handshake completes.
	LastHandshake         time.Time
	Received, Transmitted int64
}

// Peers reads the device's peers, for coordinoctl status: handshake ages
// show a cross-node problem without debug logs.
func (d *Device) Peers() ([]PeerState, error) {
	dev, err := d.client.Device(d.cfg.Device)
	if err != nil {
		return nil, fmt.Errorf("wireguard %s: %w", d.cfg.Device, err)
	}
	out := make([]PeerState, 0, len(dev.Peers))
	for _, p := range dev.Peers {
		ps := PeerState{PublicKey: p.PublicKey, LastHandshake: p.LastHandshakeTime, Received: p.ReceiveBytes, Transmitted: p.TransmitBytes}
		if p.Endpoint != nil {
			ps.Endpoint = p.Endpoint.String()
		}
		out = append(out, ps)
	}
	return out, nil
}
