package multinode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl"
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
	client, err := wgctrl.New()
	if err != nil {
		t.Logf("wireguard state: %v", err)
		return
	}
	defer client.Close()
	for _, n := range c.nodes {
		var b strings.Builder
		dev, err := client.Device(n.wgDevice)
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
