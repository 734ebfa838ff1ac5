package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coordino/coordino/test/testbed"
)

// Routing bgp: the workers stand in two racks on different subnets
// (10.233.0.0/24 with the control plane and the host, 10.233.1.0/24),
// joined only by a top-of-rack router in a namespace of its own running
// FRR (zebra and bgpd, AS RouterASN). Every node peers with the router of
// its rack and learns the other nodes' blocks from it; no node shares a
// segment with a node of the other rack, so pods reach across racks only
// through what BGP announced.
const (
	// ZoneLabel carries a worker's rack (its kubelet sets it), which the
	// bed's BGPPeerPolicies select.
	ZoneLabel = "topology.kubernetes.io/zone"
	// RouterASN is the router's AS; rack r's nodes are AS 64601+r.
	RouterASN = 65000
	rackASN   = 64601
	// AnnounceLabel="true" on a Service makes the bed's nodes announce its
	// LoadBalancer and external IPs (the policies' serviceSelector).
	AnnounceLabel = "coordino.test/announce"
	// bgpHoldSeconds is the sessions' hold time (FRR's and the nodes').
	bgpHoldSeconds = 9
)

// checkRouting refuses a Routing the bed cannot build.
func checkRouting(r string) error {
	switch r {
	case "", "bgp":
		return nil
	}
	return fmt.Errorf("cluster: Routing %q: want bgp (or empty for the manifest's default, direct on one segment)", r)
}

// racks is how many segments the workers stand on.
func (c *Cluster) racks() int {
	if c.Routing == "bgp" {
		return 2
	}
	return 1
}

// rackOf is worker i's (1-based) rack (0-based): alternating.
func (c *Cluster) rackOf(i int) int { return (i - 1) % c.racks() }

func rackName(r int) string { return fmt.Sprintf("rack-%d", r+1) }

// rackCIDR is rack r's segment; rack 0's is UnderlayCIDR.
func rackCIDR(r int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 233, byte(r), 0}), 24)
}

// routerIP is the router's address on rack r.
func routerIP(r int) netip.Addr { return netip.AddrFrom4([4]byte{10, 233, byte(r), 1}) }

// nodeGateway is where machines of rack 0 (the control plane, the host)
// send traffic for worker i's pods and address: the worker itself on the
// same segment, the router otherwise.
func (c *Cluster) nodeGateway(i int) netip.Addr {
	if c.rackOf(i) == 0 {
		return c.workerIP(i)
	}
	return routerIP(0)
}

// buildRouter creates the router namespace, plugs it into every rack's
// bridge (rack 0's is br0, rack r's br<r>) and makes it forward.
func (c *Cluster) buildRouter(u *underlay, nsName string) error {
	for r := 1; r < c.racks(); r++ {
		if err := u.addBridge(fmt.Sprintf("br%d", r)); err != nil {
			return err
		}
	}
	c.state.Netns = append(c.state.Netns, nsName)
	if err := c.saveState(); err != nil {
		return err
	}
	h, err := newNamedNetns(nsName)
	if err != nil {
		return err
	}
	defer h.Close()
	for r := 0; r < c.racks(); r++ {
		if err := u.attachTo(fmt.Sprintf("br%d", r), fmt.Sprintf("r%d", r), h, rackName(r), routerIP(r)); err != nil {
			return err
		}
	}
	return setSysctl(h, "net/ipv4/ip_forward", "1")
}

// routerDir holds FRR's config, sockets, pid files and logs.
func (c *Cluster) routerDir() string { return c.path("router") }

// frrConfig is bgpd's configuration: a neighbour per worker in its rack's
// AS. as-override lets nodes of one rack (one AS) learn each other's
// blocks, which eBGP's loop check would drop.
func (c *Cluster) frrConfig() string {
	var b strings.Builder
	fmt.Fprintf(&b, "frr defaults datacenter\nhostname tor\nlog file %s/bgpd.log\n!\nrouter bgp %d\n bgp router-id %s\n"+
		" no bgp ebgp-requires-policy\n no bgp default ipv4-unicast\n bgp graceful-restart\n timers bgp %d %d\n",
		c.routerDir(), RouterASN, routerIP(0), bgpHoldSeconds/3, bgpHoldSeconds)
	for i := 1; i <= c.Workers; i++ {
		fmt.Fprintf(&b, " neighbor %s remote-as %d\n", c.workerIP(i), rackASN+c.rackOf(i))
	}
	b.WriteString(" address-family ipv4 unicast\n")
	for i := 1; i <= c.Workers; i++ {
		fmt.Fprintf(&b, "  neighbor %s activate\n  neighbor %s as-override\n", c.workerIP(i), c.workerIP(i))
	}
	b.WriteString(" exit-address-family\n!\n")
	return b.String()
}

// bgpPolicies are the bed's BGPPeerPolicies: one per rack, selecting its
// nodes by zone, peering with the rack's router, announcing the addresses
// of Services labelled AnnounceLabel=true.
func (c *Cluster) bgpPolicies() string {
	var b strings.Builder
	for r := 0; r < c.racks(); r++ {
		fmt.Fprintf(&b, `---
apiVersion: coordino.io/v1alpha1
kind: BGPPeerPolicy
metadata:
  name: %s
spec:
  nodeSelector:
    %s: %s
  localASN: %d
  serviceSelector:
    matchLabels:
      %s: "true"
  peers:
  - address: %q
    asn: %d
    holdTimeSeconds: %d
    families: [IPv4]
`, rackName(r), ZoneLabel, rackName(r), rackASN+r, AnnounceLabel, routerIP(r), RouterASN, bgpHoldSeconds)
	}
	return b.String()
}

// startRouter runs FRR's zebra and bgpd in the router namespace as the
// frr user (root is not in its vty group), recorded like every other
// component so Teardown stops them.
func (c *Cluster) startRouter(ctx context.Context, nsName string) error {
	for _, p := range []string{"/usr/lib/frr/zebra", "/usr/lib/frr/bgpd", "/usr/bin/vtysh"} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("routing bgp needs FRR (%s missing): run hack/fabric-deps.sh", p)
		}
	}
	u, err := user.Lookup("frr")
	if err != nil {
		return fmt.Errorf("FRR's user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	dir := c.routerDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bgpd.conf"), []byte(c.frrConfig()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "zebra.conf"), []byte("hostname tor\n"), 0o644); err != nil {
		return err
	}
	zsock := filepath.Join(dir, "zserv.api")
	for _, d := range []string{"zebra", "bgpd"} {
		p := &testbed.Proc{Name: "router-" + d, Path: c.nsenter, LogPath: c.logPath("router-" + d), Args: []string{
			"--net=" + filepath.Join("/run/netns", nsName), "--", "/usr/lib/frr/" + d, "-u", "frr", "-g", "frr",
			"-f", filepath.Join(dir, d+".conf"), "-i", filepath.Join(dir, d+".pid"),
			"-z", zsock, "--vty_socket", dir, "-A", "127.0.0.1", "-P", "0"}}
		if err := p.Start(c.path("pids")); err != nil {
			return err
		}
		c.procs = append(c.procs, p)
		if d == "zebra" {
			if err := testbed.WaitFor(ctx, "zebra's socket", 20*time.Second, func() error { _, err := os.Stat(zsock); return err }); err != nil {
				return err
			}
		}
	}
	return testbed.WaitFor(ctx, "bgpd", 20*time.Second, func() error { _, err := c.Vtysh("show bgp summary json"); return err })
}

// Vtysh runs one command against the bed's router.
func (c *Cluster) Vtysh(command string) (string, error) {
	out, err := exec.Command("vtysh", "--vty_socket", c.routerDir(), "-c", command).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("vtysh -c %q: %w: %s", command, err, out)
	}
	return string(out), nil
}

// RouterRoutes is the router's IPv4 BGP table: each valid prefix and its
// next hop.
func (c *Cluster) RouterRoutes() (map[netip.Prefix]netip.Addr, error) {
	out, err := c.Vtysh("show bgp ipv4 unicast json")
	if err != nil {
		return nil, err
	}
	return parseRouterTable([]byte(out))
}

func parseRouterTable(data []byte) (map[netip.Prefix]netip.Addr, error) {
	var tbl struct {
		Routes map[string][]struct {
			Valid    bool `json:"valid"`
			Nexthops []struct {
				IP string `json:"ip"`
			} `json:"nexthops"`
		} `json:"routes"`
	}
	if err := json.Unmarshal(data, &tbl); err != nil {
		return nil, fmt.Errorf("router table: %w", err)
	}
	got := map[netip.Prefix]netip.Addr{}
	for k, rs := range tbl.Routes {
		p, err := netip.ParsePrefix(k)
		if err != nil {
			return nil, fmt.Errorf("router table: prefix %q: %w", k, err)
		}
		for _, r := range rs {
			if r.Valid && len(r.Nexthops) > 0 {
				nh, err := netip.ParseAddr(r.Nexthops[0].IP)
				if err != nil {
					return nil, fmt.Errorf("router table: %s next hop %q: %w", p, r.Nexthops[0].IP, err)
				}
				got[p] = nh
				break
			}
		}
	}
	return got, nil
}

// missingBlocks names the workers of which the router has no block (a
// prefix inside the worker's IPPool, next hop the worker's address).
func (c *Cluster) missingBlocks(tbl map[netip.Prefix]netip.Addr) []string {
	var missing []string
	for i := 1; i <= c.Workers; i++ {
		found := false
		for p, nh := range tbl {
			found = found || (workerPodCIDR(i).Contains(p.Addr()) && nh == c.workerIP(i))
		}
		if !found {
			missing = append(missing, fmt.Sprintf("worker-%d (%s via %s)", i, workerPodCIDR(i), c.workerIP(i)))
		}
	}
	return missing
}

// applyBGPPolicies applies the bed's BGPPeerPolicies.
func (c *Cluster) applyBGPPolicies(ctx context.Context) error {
	if _, err := c.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "crd/bgppeerpolicies.coordino.io"); err != nil {
		return err
	}
	return c.applyString(ctx, c.bgpPolicies())
}

// WaitRouterBlocks waits until the router has a block of every worker from
// that worker.
func (c *Cluster) WaitRouterBlocks(ctx context.Context) error {
	var tbl map[netip.Prefix]netip.Addr
	err := testbed.WaitFor(ctx, "every worker's blocks in the router", 2*time.Minute, func() error {
		var err error
		if tbl, err = c.RouterRoutes(); err != nil {
			return err
		}
		if m := c.missingBlocks(tbl); len(m) > 0 {
			return fmt.Errorf("router has no block of %s", strings.Join(m, ", "))
		}
		return nil
	})
	if err != nil {
		summary, _ := c.Vtysh("show bgp summary")
		return fmt.Errorf("%w; router: %s", err, summary)
	}
	c.Logf("cluster: router's BGP table %v", tbl)
	return nil
}
