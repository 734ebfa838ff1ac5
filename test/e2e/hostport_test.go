package e2e

import (
	"net/netip"
	"testing"

	"github.com/coordino/coordino/conflist"
	"github.com/coordino/coordino/test/harness"
)

// TestPrimaryHostPort drives the installer's primary conflist (Coordino, then
// portmap) through libcni with runtimeConfig.portMappings, as kubelet's
// runtime does for a pod with a hostPort, for each portmap backend. A
// listener of the node's own sits on the host port: a connection reaching
// the pod instead proves the mapping; after DEL the node's listener answers
// again, proving DEL removed it.
func TestPrimaryHostPort(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.78.0.0/24"}})
			list, err := conflist.Build(conflist.Options{Knobs: conflist.Knobs{RunDir: n.RunDir}, PortMap: true, PortMapBackend: backend})
			if err != nil {
				t.Fatal(err)
			}
			c := newCNI(t, n, list)
			const hostPort, podPort = 30080, 8080

			stopNode, err := harness.Serve(n.NS, n.NodeIP, hostPort, "node")
			if err != nil {
				t.Fatal(err)
			}
			defer stopNode()

			web := newPod(t, "web")
			rt := harness.RuntimeConf(web, "eth0")
			rt.CapabilityArgs = map[string]any{"portMappings": []map[string]any{
				{"hostPort": hostPort, "containerPort": podPort, "protocol": "tcp"},
			}}
			res, err := c.Add(ctx(t), rt)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if err := c.Check(ctx(t), rt); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			addrs, err := harness.Addresses(res)
			if err != nil || len(addrs) != 1 {
				t.Fatalf("addresses %v, %v", addrs, err)
			}
			stopWeb, err := harness.Serve(web.NS, addrs[0], podPort, "web")
			if err != nil {
				t.Fatal(err)
			}
			defer stopWeb()
			client, _, _ := addPod(t, c, "client")

			// From the node itself (OUTPUT), from 127.0.0.1 (portmap's
			// snat), and from another pod, which arrives like traffic from
			// another machine (PREROUTING).
			from := []struct {
				name string
				src  *harness.Pod
				dst  netip.Addr
			}{
				{"node", nil, n.NodeIP},
				{"node loopback", nil, netip.MustParseAddr("127.0.0.1")},
				{"pod", client, n.NodeIP},
			}
			for _, f := range from {
				netns := n.NS
				if f.src != nil {
					netns = f.src.NS
				}
				if got, err := harness.Dial(netns, f.dst, hostPort); err != nil || got != "web" {
					t.Errorf("%s → %v:%d reached %q (%v), want the pod", f.name, f.dst, hostPort, got, err)
				}
			}

			if err := c.Del(ctx(t), rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if got, err := harness.Dial(n.NS, n.NodeIP, hostPort); err != nil || got != "node" {
				t.Errorf("after DEL node → %v:%d reached %q (%v), want the node's own listener", n.NodeIP, hostPort, got, err)
			}
		})
	}
}
