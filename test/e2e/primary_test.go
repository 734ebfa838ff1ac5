package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/test/harness"
)

// addPod attaches a new pod and returns it with its addresses.
func addPod(t *testing.T, c *harness.CNI, name string) (*harness.Pod, *libcni.RuntimeConf, []netip.Addr) {
	t.Helper()
	p := newPod(t, name)
	rt := harness.RuntimeConf(p, "eth0")
	res, err := c.Add(ctx(t), rt)
	if err != nil {
		t.Fatalf("ADD %s: %v", name, err)
	}
	addrs, err := harness.Addresses(res)
	if err != nil {
		t.Fatal(err)
	}
	return p, rt, addrs
}

func TestPrimaryAddResultAndConnectivity(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.71.0.0/24", "fd71::/64"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))

	p1, rt1, a1 := addPod(t, c, "web")
	p2, _, a2 := addPod(t, c, "client")
	if len(a1) != 2 || !a1[0].Is4() || !a1[1].Is6() {
		t.Fatalf("dual-stack pod got %v", a1)
	}
	for _, a := range append(a1, a2...) {
		if !netip.MustParsePrefix("10.71.0.0/24").Contains(a) && !netip.MustParsePrefix("fd71::/64").Contains(a) {
			t.Fatalf("address %v outside the node's CIDRs", a)
		}
	}
	if a1[0] == a2[0] || a1[1] == a2[1] {
		t.Fatalf("two pods share an address: %v %v", a1, a2)
	}

	// The cached result is what the runtime sees: check its shape.
	cached, err := c.Config.GetNetworkListCachedResult(c.List, rt1)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := current.NewResultFromResult(cached)
	if len(res.Interfaces) != 2 || res.Interfaces[1].Name != "eth0" || res.Interfaces[1].Sandbox != p1.NS.Path() ||
		!strings.HasPrefix(res.Interfaces[0].Name, "cdo") || len(res.Interfaces[0].Name) != 15 {
		t.Fatalf("interfaces = %s", harness.ResultJSON(res))
	}
	// Policy enforcement is attached to the host veth, both directions, before ADD returned.
	if in, out, err := n.BPFFilters(res.Interfaces[0].Name); err != nil || in != 1 || out != 1 {
		t.Fatalf("cls_bpf filters on %s: ingress %d egress %d, %v", res.Interfaces[0].Name, in, out, err)
	}
	if len(res.Routes) != 2 || res.IPs[0].Gateway.String() != "169.254.1.1" || res.IPs[0].Address.String() != a1[0].String()+"/32" {
		t.Fatalf("ips/routes = %s", harness.ResultJSON(res))
	}

	// Inside the pod: eth0 up with the address, default route via the link-local gateway.
	if err := p1.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if l.Attrs().OperState != netlink.OperUp && l.Attrs().Flags&1 == 0 {
			return fmt.Errorf("eth0 is down")
		}
		routes, err := netlink.RouteList(l, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst == nil || r.Dst.IP.IsUnspecified() {
				if r.Gw.String() == "169.254.1.1" {
					return nil
				}
			}
		}
		return fmt.Errorf("no default route via 169.254.1.1 in %v", routes)
	}); err != nil {
		t.Fatal(err)
	}

	// pod↔pod over both families, and node→pod (kubelet probes).
	for _, a := range a1 {
		stop, err := harness.Serve(p1.NS, a, 8080, "web")
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		if got, err := harness.Dial(p2.NS, a, 8080); err != nil || got != "web" {
			t.Fatalf("pod→pod %v: %q, %v", a, got, err)
		}
		if got, err := harness.Dial(n.NS, a, 8080); err != nil || got != "web" {
			t.Fatalf("node→pod %v: %q, %v", a, got, err)
		}
	}
}

func TestResultFollowsRequestedVersion(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.72.0.0/24"}})
	for _, v := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		c := newCNI(t, n, n.PrimaryConflist("net-"+strings.ReplaceAll(v, ".", ""), v))
		p := newPod(t, "v"+v)
		res, err := c.Add(ctx(t), harness.RuntimeConf(p, "eth0"))
		if err != nil {
			t.Fatalf("cniVersion %s: %v", v, err)
		}
		if res.Version() != v {
			t.Fatalf("cniVersion %s: result version %s", v, res.Version())
		}
		if err := c.Del(ctx(t), harness.RuntimeConf(p, "eth0")); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDelIsIdempotentAndNeedsNothing(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.73.0.0/24"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	p, rt, _ := addPod(t, c, "p")
	for i := 0; i < 2; i++ {
		if err := c.Del(ctx(t), rt); err != nil {
			t.Fatalf("DEL #%d: %v", i+1, err)
		}
	}
	if err := n.Leaks(0); err != nil {
		t.Fatal(err)
	}
	// Without netns, without prevResult, for a container never seen.
	plugin := pluginConf(n.RunDir, nil)
	for _, netnsPath := range []string{"", p.NS.Path()} {
		_, cniErr, _, err := harness.ExecPlugin(harness.Invocation{Command: "DEL", ContainerID: "never-seen-" + harness.RandomSuffix(4), Netns: netnsPath, IfName: "eth0", Stdin: plugin})
		if err != nil || cniErr != nil {
			t.Fatalf("DEL of unknown container (netns %q): %v %v", netnsPath, err, cniErr)
		}
	}
}

func TestConcurrentAddDelUniqueAddresses(t *testing.T) {
	const pods = 32
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.74.0.0/24", "fd74::/64"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	type added struct {
		rt    *libcni.RuntimeConf
		addrs []netip.Addr
	}
	results := make([]added, pods)
	podList := make([]*harness.Pod, pods)
	for i := range podList {
		podList[i] = newPod(t, fmt.Sprintf("p%d", i))
	}
	var wg sync.WaitGroup
	errs := make(chan error, pods)
	for i := 0; i < pods; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			rt := harness.RuntimeConf(podList[i], "eth0")
			res, err := c.Add(ctx(t), rt)
			if err != nil {
				errs <- err
				return
			}
			a, err := harness.Addresses(res)
			if err != nil {
				errs <- err
				return
			}
			results[i] = added{rt, a}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[netip.Addr]int{}
	for i, r := range results {
		for _, a := range r.addrs {
			if j, dup := seen[a]; dup {
				t.Fatalf("pods %d and %d both got %v", i, j, a)
			}
			seen[a] = i
		}
	}
	if len(seen) != 2*pods {
		t.Fatalf("%d distinct addresses for %d dual-stack pods", len(seen), pods)
	}
	if err := n.Leaks(pods); err != nil {
		t.Fatal(err)
	}
	errs = make(chan error, pods)
	for i := 0; i < pods; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := c.Del(ctx(t), results[i].rt); err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := n.Leaks(0); err != nil {
		t.Fatal(err)
	}
}

func TestCheckReportsWhatIsWrong(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.75.0.0/24"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	p, rt, addrs := addPod(t, c, "p")
	if err := c.Check(ctx(t), rt); err != nil {
		t.Fatalf("CHECK of a healthy pod: %v", err)
	}
	// Break the host route to the pod: CHECK must name it.
	if err := n.NS.Do(func(ns.NetNS) error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: netlinkHost(addrs[0])}, netlink.RT_FILTER_DST)
		if err != nil || len(routes) != 1 {
			return fmt.Errorf("host route to %v: %v %v", addrs[0], routes, err)
		}
		return netlink.RouteDel(&routes[0])
	}); err != nil {
		t.Fatal(err)
	}
	err := c.Check(ctx(t), rt)
	if err == nil || !strings.Contains(err.Error(), addrs[0].String()) || !strings.Contains(err.Error(), "route") {
		t.Fatalf("CHECK after deleting the host route = %v", err)
	}
	// Remove the pod's address: CHECK names the address and eth0.
	_ = c.Del(ctx(t), rt)
	_, rt, addrs = addPod(t, c, "q")
	q := rt.NetNS
	if err := ns.WithNetNSPath(q, func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.AddrDel(l, &netlink.Addr{IPNet: netlinkHost(addrs[0])})
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.Check(ctx(t), rt); err == nil || !strings.Contains(err.Error(), addrs[0].String()) {
		t.Fatalf("CHECK after deleting the pod address = %v", err)
	}
	// CHECK of an attachment Coordino never made: unknown container (3).
	other := harness.RuntimeConf(p, "eth1")
	plugin := pluginConf(n.RunDir, map[string]any{"prevResult": map[string]any{"cniVersion": "1.1.0"}})
	_, cniErr, _, err := harness.ExecPlugin(harness.Invocation{Command: "CHECK", ContainerID: other.ContainerID, Netns: other.NetNS, IfName: "eth1", Stdin: plugin})
	if err != nil || cniErr == nil || cniErr.Code != types.ErrUnknownContainer {
		t.Fatalf("CHECK of unknown attachment: %v %+v", err, cniErr)
	}
}

func netlinkHost(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}
}
