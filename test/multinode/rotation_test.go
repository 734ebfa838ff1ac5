package multinode

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/coordino/coordino/daemon/wireguard"
	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// TestWireGuardKeyRotation rotates the keys of two of three nodes at once
// under continuous cross-node traffic (pod <-> pod both families, node ->
// remote pod): the rotation is requested with the trigger file, stays
// pending (old key in use, traffic unaffected) until the peers file carries
// the new public keys, then every node switches; no connection may break
// and the devices end up with the new keys.
func TestWireGuardKeyRotation(t *testing.T) {
	for _, m := range wgModes {
		t.Run(m.name, func(t *testing.T) { testWireGuardKeyRotation(t, m) })
	}
}

func testWireGuardKeyRotation(t *testing.T, m mode) {
	start := time.Now()
	c := newCluster(t, m, 3)
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
	dev, err := n.wgState()
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

// stallLimit is the longest a connection may go without receiving while a
// key rotates: the new key costs one handshake round trip plus the time
// between the two nodes applying their peers files, where a rejected or
// crossed handshake costs WireGuard's retry (5 s, REKEY_TIMEOUT). On an
// idle host the stall is milliseconds; with CI's packages running side by
// side on two cores the userspace device's applies have stood 1.0 s apart
// (a stall of that length), so the limit sits between the two.
const stallLimit = 2 * time.Second

// guestStallLimit replaces stallLimit where privileged.Slowdown says the
// machine is slow (a qemu guest): the stall while the two nodes' peers
// files are applied one after the other lasts as long as the gap between
// them, and there each apply takes about a second of emulated work, where
// it takes milliseconds on a host. It stays below WireGuard's 5 s retry of
// a rejected or crossed handshake, the stall the limit exists to catch.
func guestStallLimit() time.Duration {
	return min(max(stallLimit, privileged.Slowdown(stallLimit)), 3*time.Second)
}

// TestWireGuardKeyRotationNoStall rotates the keys of two nodes, in turn,
// six times under four paced TCP connections between their pods (each
// direction, both families) and requires that no connection goes more than
// stallLimit without receiving. The peers files reach the two nodes in the
// orders a rollout produces: the peer a few ms before the rotating node,
// both at once, and the rotating node first. After each rotation no peer
// may keep the settling keepalive once its handshake is done, and no node
// may report peers still without a handshake.
func TestWireGuardKeyRotationNoStall(t *testing.T) {
	for _, m := range wgModes {
		t.Run(m.name, func(t *testing.T) { testWireGuardKeyRotationNoStall(t, m) })
	}
}

func testWireGuardKeyRotationNoStall(t *testing.T, m mode) {
	c := newCluster(t, m, 2)
	addServingPods(t, c)
	checkRotationNoStall(t, c)
}

// checkRotationNoStall is TestWireGuardKeyRotationNoStall on c, a cluster
// of two nodes with serving pods.
func checkRotationNoStall(t *testing.T, c *cluster) {
	n0, n1 := c.nodes[0], c.nodes[1]
	var flows []*pacedFlow
	for _, v6 := range []bool{false, true} {
		flows = append(flows, startPaced(t, n0.pods[0].NS, n1.pods[0].addr(v6)), startPaced(t, n1.pods[0].NS, n0.pods[0].addr(v6)))
	}
	warned := map[*node]int{}
	for _, n := range c.nodes {
		warned[n] = strings.Count(n.LogTail(1<<20), stillWithoutHandshake)
	}
	// lead: how long before the rotating node the peer gets the new file
	// (negative: after it).
	leads := []time.Duration{5 * time.Millisecond, 0, -5 * time.Millisecond, 20 * time.Millisecond, 0, -20 * time.Millisecond}
	start := time.Now()
	var lastWrite time.Time
	for i, lead := range leads {
		r, p := c.nodes[i%2], c.nodes[1-i%2]
		old := publicKey(t, r)
		if err := os.WriteFile(filepath.Join(r.StateDir, wireguard.RotateTriggerFile), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		var next string
		if err := eventually(10*time.Second, func() error {
			if next = publishedKey(r); next == old {
				return fmt.Errorf("%s published no new key", r.Name)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		data := c.peersFile(c.nodes)
		first, second, gap := p, r, lead
		if lead < 0 {
			first, second, gap = r, p, -lead
		}
		lastWrite = time.Now()
		c.writePeersFile(first, data)
		time.Sleep(gap)
		c.writePeersFile(second, data)
		if err := eventually(10*time.Second, func() error { return rotated(r, p, next, lastWrite) }); err != nil {
			c.logTunnels(t)
			t.Fatalf("rotation %d of %s: %v", i, r.Name, err)
		}
		// A peer whose handshake is done loses the settling keepalive at
		// the daemon's next look (every 250 ms), and none is switched on
		// later (a peer looking unshaken would get it after 2 s, for 8 s).
		if err := eventually(time.Second, func() error { return noKeepalive(c.nodes) }); err != nil {
			t.Errorf("rotation %d of %s (peer file %v ahead), handshake done: %v", i, r.Name, lead, err)
		} else if err := steadily(2500*time.Millisecond, func() error { return noKeepalive(c.nodes) }); err != nil {
			t.Errorf("rotation %d of %s (peer file %v ahead), handshake done: %v", i, r.Name, lead, err)
		}
	}
	end := time.Now()
	worst, limit := time.Duration(0), guestStallLimit()
	for i, f := range flows {
		g, at, err := f.finish(start, end)
		if err != nil {
			t.Errorf("flow %d: %v", i, err)
		}
		worst = max(worst, g)
		if g > limit {
			t.Errorf("flow %d received nothing for %v (from %v into the rotations), limit %v", i, g.Round(time.Millisecond), at.Sub(start).Round(time.Millisecond), limit)
			c.logHandshakes(t, at.Add(-200*time.Millisecond), at.Add(g))
		}
	}
	t.Logf("largest gap in any of %d flows over %d rotations: %v", len(flows), len(leads), worst.Round(time.Millisecond))
	// Settling gives up (and warns) settleFor after a change: wait that long.
	time.Sleep(time.Until(lastWrite.Add(9 * time.Second)))
	for _, n := range c.nodes {
		if got := strings.Count(n.LogTail(1<<20), stillWithoutHandshake); got != warned[n] {
			t.Errorf("%s logged %q %d times during the rotations", n.Name, stillWithoutHandshake, got-warned[n])
		}
	}
}

// steadily checks f every 100 ms for d and returns its first error.
func steadily(d time.Duration, f func() error) error {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// stillWithoutHandshake starts the daemon's warning about peers that did
// not handshake while settling.
const stillWithoutHandshake = "wireguard peers still without a handshake"

// rotated reports whether r's device uses the key next and both ends have
// handshaken since the peers files were written.
func rotated(r, p *node, next string, since time.Time) error {
	rd, err := r.wgState()
	if err != nil {
		return err
	}
	if rd.PublicKey.String() != next {
		return fmt.Errorf("%s's device still uses %s, want %s", r.Name, rd.PublicKey, next)
	}
	pd, err := p.wgState()
	if err != nil {
		return err
	}
	for _, d := range []*wgtypes.Device{rd, pd} {
		if len(d.Peers) != 1 {
			return fmt.Errorf("%s has %d peers, want 1", d.Name, len(d.Peers))
		}
		if peer := d.Peers[0]; !peer.LastHandshakeTime.After(since) {
			return fmt.Errorf("%s: no handshake with %s since the peers file changed", d.Name, peer.PublicKey)
		}
	}
	if pd.Peers[0].PublicKey.String() != next {
		return fmt.Errorf("%s still has %s's old key", p.Name, r.Name)
	}
	return nil
}

// noKeepalive reports peers that still have a persistent keepalive.
func noKeepalive(nodes []*node) error {
	var errs []error
	for _, n := range nodes {
		d, err := n.wgState()
		if err != nil {
			return err
		}
		for _, p := range d.Peers {
			if p.PersistentKeepaliveInterval != 0 {
				errs = append(errs, fmt.Errorf("%s: peer %s keeps a %v keepalive, handshake %v ago",
					n.Name, p.PublicKey, p.PersistentKeepaliveInterval, time.Since(p.LastHandshakeTime).Round(time.Millisecond)))
			}
		}
	}
	return errors.Join(errs...)
}

// pacedFlow sends pacedChunk bytes every pacedEvery through a pod's TCP
// echo and records when echoed data arrives: the gaps between arrivals
// are what a stalled tunnel shows, whatever the machine's load does to
// the test's own timers.
type pacedFlow struct {
	conn     net.Conn
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	arrivals []time.Time
	err      error
}

const (
	pacedChunk = 1 << 10
	pacedEvery = 10 * time.Millisecond
)

func startPaced(t *testing.T, from ns.NetNS, addr netip.Addr) *pacedFlow {
	t.Helper()
	conn, err := harness.DialFrom(from, "tcp", addr, echoPort, 3*time.Second)
	if err != nil {
		t.Fatalf("flow to %v: %v", addr, err)
	}
	f := &pacedFlow{conn: conn, stop: make(chan struct{})}
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		tick := time.NewTicker(pacedEvery)
		defer tick.Stop()
		chunk := make([]byte, pacedChunk)
		for {
			select {
			case <-f.stop:
				return
			case <-tick.C:
			}
			if _, err := conn.Write(chunk); err != nil {
				select {
				case <-f.stop:
				default:
					f.fail(fmt.Errorf("write: %w", err))
				}
				return
			}
		}
	}()
	go func() {
		defer f.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			if _, err := conn.Read(buf); err != nil {
				select {
				case <-f.stop:
				default:
					f.fail(fmt.Errorf("read: %w", err))
				}
				return
			}
			f.mu.Lock()
			f.arrivals = append(f.arrivals, time.Now())
			f.mu.Unlock()
		}
	}()
	t.Cleanup(func() { f.close() })
	return f
}

func (f *pacedFlow) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *pacedFlow) close() {
	select {
	case <-f.stop:
		return
	default:
	}
	close(f.stop)
	f.conn.Close()
	f.wg.Wait()
}

// finish stops the flow and returns the longest time within [from, to]
// without an arrival, when it began, and the flow's error.
func (f *pacedFlow) finish(from, to time.Time) (time.Duration, time.Time, error) {
	f.close()
	f.mu.Lock()
	defer f.mu.Unlock()
	var gap time.Duration
	at, prev := from, from
	for _, a := range append(f.arrivals, to) {
		if a.Before(from) {
			continue
		}
		if a.After(to) {
			a = to
		}
		if d := a.Sub(prev); d > gap {
			gap, at = d, prev
		}
		prev = a
	}
	return gap, at, f.err
}
