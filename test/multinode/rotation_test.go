package multinode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl"

	"github.com/coordino/coordino/daemon/wireguard"
	"github.com/coordino/coordino/test/harness"
)

// TestWireGuardKeyRotation rotates the keys of two of three nodes at once
// under continuous cross-node traffic (pod <-> pod both families, node ->
// remote pod): the rotation is requested with the trigger file, stays
// pending (old key in use, traffic unaffected) until the peers file carries
// the new public keys, then every node switches; no connection may break
// and the devices end up with the new keys.
func TestWireGuardKeyRotation(t *testing.T) {
	start := time.Now()
	c := newCluster(t, wgUser, 3)
	addServingPods(t, c)
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	var streams []*stream
	for _, v6 := range []bool{false, true} {
		streams = append(streams,
			startStream(t, n0.pods[0].NS, n1.pods[0].addr(v6)), startStream(t, n1.pods[0].NS, n0.pods[0].addr(v6)),
			startStream(t, n2.pods[0].NS, n0.pods[0].addr(v6)), startStream(t, n1.NS, n0.pods[0].addr(v6)))
	}
	rotating := []*node{n0, n1}
	old := map[*node]string{}
	for _, n := range rotating {
		old[n] = publicKey(t, n)
		if err := os.WriteFile(filepath.Join(n.StateDir, wireguard.RotateTriggerFile), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	next := map[*node]string{}
	for _, n := range rotating {
		if err := eventually(10*time.Second, func() error {
			next[n] = publishedKey(n)
			if next[n] == "" || next[n] == old[n] {
				return fmt.Errorf("%s published no new key", n.Name)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(filepath.Join(n.StateDir, wireguard.NextPrivateKeyFile))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: pending key file: %v, %v", n.Name, err, fi)
		}
	}
	// Pending: nobody was told, so the old keys stay in use.
	for i, err := range progressing(streams, time.Second) {
		if err != nil {
			t.Errorf("stream %d while the rotation is pending: %v", i, err)
			c.logTunnels(t)
		}
	}
	for _, n := range rotating {
		if got := publicKey(t, n); got != old[n] {
			t.Errorf("%s switched to %s before its peers were told", n.Name, got)
		}
		// Removed right after the key was published.
		if _, err := os.Stat(filepath.Join(n.StateDir, wireguard.RotateTriggerFile)); err == nil {
			t.Errorf("%s: trigger file left behind", n.Name)
		}
	}
	c.writePeers(c.nodes)
	for _, n := range rotating {
		if err := eventually(10*time.Second, func() error {
			if got := publicKey(t, n); got != next[n] {
				return fmt.Errorf("%s's device still uses %s, want %s", n.Name, got, next[n])
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
	for i, err := range progressing(streams, 2*time.Second) {
		if err != nil {
			t.Errorf("stream %d after the rotation: %v", i, err)
			c.logTunnels(t)
		}
	}
	for i, s := range streams {
		if k, err := s.finish(); err != nil {
			t.Errorf("stream %d broke after %d exchanges: %v", i, k, err)
			c.logTunnels(t)
		}
	}
	for _, v6 := range []bool{false, true} {
		if err := reach(n2.pods[0].NS, n1.pods[0], v6); err != nil {
			t.Errorf("new connection after the rotation (v6=%v): %v", v6, err)
			c.logTunnels(t)
		}
	}
	t.Logf("key rotation under traffic: %v", time.Since(start).Round(time.Millisecond))
}

// serveEcho serves the name and echo ports on p's address of one family.
func serveEcho(p *pod, v6 bool) (func(), error) {
	stopName, err := harness.Serve(p.NS, p.addr(v6), namePort, p.Name)
	if err != nil {
		return nil, err
	}
	stopEcho, err := harness.ServeTCPEcho(p.NS, p.addr(v6), echoPort)
	if err != nil {
		stopName()
		return nil, err
	}
	return func() { stopName(); stopEcho() }, nil
}

// publicKey is the public key n's device uses now.
func publicKey(t *testing.T, n *node) string {
	t.Helper()
	client, err := wgctrl.New()
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	dev, err := client.Device(n.wgDevice)
	if err != nil {
		t.Fatal(err)
	}
	return dev.PublicKey.String()
}

// publishedKey is the public key n asks its peers to use.
func publishedKey(n *node) string {
	data, _ := os.ReadFile(filepath.Join(n.StateDir, wireguard.PublicKeyFile))
	return strings.TrimSpace(string(data))
}
