package multinode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// logTunnels records, once per test, what each node's WireGuard device
// knows of its peers and the end of its handshake log (the daemons run at
// debug level, so the userspace device logs every handshake): a tunnel that
// did not come up then shows which end stopped trying.
func (c *cluster) logTunnels(t *testing.T) {
	t.Helper()
	if c.mode.encryption != "wireguard" || c.tunnelsLogged {
		return
	}
	c.tunnelsLogged = true
	for _, n := range c.nodes {
		var b strings.Builder
		dev, err := n.wgState()
		if err != nil {
			fmt.Fprintf(&b, "  device: %v\n", err)
		} else {
			fmt.Fprintf(&b, "  key %.8s port %d\n", dev.PublicKey, dev.ListenPort)
			for _, p := range dev.Peers {
				last := "never"
				if !p.LastHandshakeTime.IsZero() {
					last = time.Since(p.LastHandshakeTime).Round(time.Millisecond).String() + " ago"
				}
				fmt.Fprintf(&b, "  peer %.8s endpoint %v handshake %s rx %d tx %d keepalive %v\n",
					p.PublicKey, p.Endpoint, last, p.ReceiveBytes, p.TransmitBytes, p.PersistentKeepaliveInterval)
			}
		}
		log, _ := os.ReadFile(filepath.Join(n.RunDir, "wireguard-"+n.wgDevice+".log"))
		lines := strings.Split(strings.TrimRight(string(log), "\n"), "\n")
		if len(lines) > 25 {
			lines = lines[len(lines)-25:]
		}
		t.Logf("%s wireguard at %s:\n%s  handshake log:\n    %s", n.Name, time.Now().Format("15:04:05.000000"),
			b.String(), strings.Join(lines, "\n    "))
	}
}

// tunnelBringUp bounds how long a fresh cluster's WireGuard tunnels may
// take to handshake once the peers are distributed. The daemons bring them
// up in about a second; the rest is room for a loaded CI machine (WireGuard
// itself retries every 5 s), so that the subtests judge reachability and
// policy rather than the bring-up, which this wait judges and names.
const tunnelBringUp = 30 * time.Second

// waitTunnels waits until every node's device has handshaken with every
// other node, and logs how long that took.
func (c *cluster) waitTunnels() {
	t := c.t
	t.Helper()
	start := time.Now()
	err := eventually(tunnelBringUp, func() error {
		var errs []error
		for _, n := range c.nodes {
			dev, err := n.wgState()
			if err != nil {
				return err
			}
			up := 0
			for _, p := range dev.Peers {
				if !p.LastHandshakeTime.IsZero() {
					up++
				}
			}
			if up != len(c.nodes)-1 {
				errs = append(errs, fmt.Errorf("%s: %d of %d tunnels handshaken", n.Name, up, len(c.nodes)-1))
			}
		}
		return errors.Join(errs...)
	})
	if err != nil {
		c.logTunnels(t)
		t.Fatalf("wireguard tunnels not up %v after the peers were distributed: %v", tunnelBringUp, err)
	}
	t.Logf("wireguard tunnels up in %v", time.Since(start).Round(time.Millisecond))
}

// logHandshakes logs what each node's userspace device logged between from
// and to (its lines carry microsecond local timestamps): which end
// initiated, which message was rejected, when a peer was re-created.
func (c *cluster) logHandshakes(t *testing.T, from, to time.Time) {
	t.Helper()
	for _, n := range c.nodes {
		log, _ := os.ReadFile(filepath.Join(n.RunDir, "wireguard-"+n.wgDevice+".log"))
		var b strings.Builder
		for _, line := range strings.Split(string(log), "\n") {
			_, rest, ok := strings.Cut(line, ") ")
			if !ok || len(rest) < len(wgLogTime) {
				continue
			}
			at, err := time.ParseInLocation(wgLogTime, rest[:len(wgLogTime)], time.Local)
			if err != nil || at.Before(from) || at.After(to) {
				continue
			}
			fmt.Fprintf(&b, "    %s\n", rest)
		}
		t.Logf("%s wireguard log %s to %s:\n%s", n.Name, from.Format("15:04:05.000000"), to.Format("15:04:05.000000"), b.String())
	}
}

// wgLogTime is how coordino-wireguard stamps its log lines.
const wgLogTime = "2006/01/02 15:04:05.000000"
