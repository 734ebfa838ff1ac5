package nftdp

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"go.uber.org/zap/zaptest"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/coordino/coordino/daemon/datapath/dpapi"
	"github.com/coordino/coordino/daemon/internal/testnet"
	"github.com/coordino/coordino/daemon/policy"
	"github.com/coordino/coordino/test/privileged"
)

// cluster is a node (the test's netns) with the nftables datapath and pods
// behind veths: "a" (app=client), "b" (app=server) in namespace default,
// "c" (app=client) in namespace other, and "ext", an unattached host
// standing in for the world.
type cluster struct {
	t    testing.TB
	cfg  Config
	dp   *Datapath
	dual bool
	pods map[string]*testnet.Pod
	eps  map[string]dpapi.Endpoint
}

var podIPs = map[string]netip.Addr{
	"a": netip.MustParseAddr("198.51.100.10"), "b": netip.MustParseAddr("198.51.100.11"),
	"c": netip.MustParseAddr("198.51.100.12"), "d": netip.MustParseAddr("198.51.100.13"),
	"ext": netip.MustParseAddr("203.0.113.10"),
}

var podIPs6 = map[string]netip.Addr{
	"a": netip.MustParseAddr("2001:db8:1::10"), "b": netip.MustParseAddr("2001:db8:1::11"),
	"c": netip.MustParseAddr("2001:db8:1::12"), "d": netip.MustParseAddr("2001:db8:1::13"),
	"ext": netip.MustParseAddr("2001:db8:2::10"),
}

func newCluster(t testing.TB, dual bool) *cluster {
	t.Helper()
	privileged.Require(t)
	c := &cluster{t: t, dual: dual, pods: map[string]*testnet.Pod{}, eps: map[string]dpapi.Endpoint{}}
	c.cfg = Config{StateDir: filepath.Join(t.TempDir(), "nftables"), Logger: zaptest.NewLogger(t),
		NodeIPs: []netip.Addr{testnet.NodeIP, testnet.NodeIP6}}
	t.Cleanup(func() {
		if err := Remove(); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
	c.open()
	if err := c.dp.UpdatePolicy(policy.Snapshot{}); err != nil {
		t.Fatal(err)
	}
	c.pods["ext"] = testnet.NewPod(t, "ext", podIPs["ext"], c.extraIPs("ext")...)
	c.addPod("a", "default", map[string]string{"app": "client"})
	c.addPod("b", "default", map[string]string{"app": "server"})
	c.addPod("c", "other", map[string]string{"app": "client"})
	return c
}

func (c *cluster) extraIPs(name string) []netip.Addr {
	if c.dual {
		return []netip.Addr{podIPs6[name]}
	}
	return nil
}

func (c *cluster) open() {
	c.t.Helper()
	dp, err := Open(c.cfg)
	if err != nil {
		c.t.Fatalf("Open: %v", err)
	}
	c.dp = dp
	c.t.Cleanup(func() { dp.Close() })
}

// finishDetaches finishes the dying endpoints' detaches now, as the sweep
// does before it deletes.
func (c *cluster) finishDetaches() {
	c.t.Helper()
	c.dp.mu.Lock()
	defer c.dp.mu.Unlock()
	for _, r := range c.dp.dying {
		c.dp.finishDetach(r)
	}
	if err := c.dp.flush(); err != nil {
		c.t.Fatal(err)
	}
}

// sweep finishes the dying endpoints' detaches and deletes the doomed
// objects now.
func (c *cluster) sweep() {
	c.t.Helper()
	c.dp.mu.Lock()
	defer c.dp.mu.Unlock()
	if err := c.dp.sweepAll(); err != nil {
		c.t.Fatalf("sweep: %v", err)
	}
	if len(c.dp.doomed)+len(c.dp.dying) > 0 {
		c.t.Fatalf("%d objects doomed, %d endpoints dying after a sweep", len(c.dp.doomed), len(c.dp.dying))
	}
}

func (c *cluster) addPod(name, ns string, labels map[string]string) {
	c.t.Helper()
	p := testnet.NewPod(c.t, name, podIPs[name], c.extraIPs(name)...)
	c.pods[name] = p
	if c.dual {
		for _, port := range testnet.Ports {
			p.ServeTCP(c.t, "tcp6", netip.AddrPortFrom(podIPs6[name], uint16(port)).String())
		}
	}
	ep := dpapi.Endpoint{Key: "net/" + name + "-" + filepath.Base(c.t.Name()) + "/eth0", HostIfName: p.HostIfName,
		HostIfIndex: p.HostIfIndex, IPs: p.IPs, Namespace: ns, Labels: labels}
	if err := c.dp.AttachEndpoint(ep); err != nil {
		c.t.Fatalf("attach %s: %v", name, err)
	}
	c.eps[name] = ep
}

func (c *cluster) policies(docs ...string) {
	c.t.Helper()
	if err := c.dp.UpdatePolicy(snapshotOf(c.t, docs...)); err != nil {
		c.t.Fatalf("UpdatePolicy: %v", err)
	}
}

func snapshotOf(t testing.TB, docs ...string) policy.Snapshot {
	t.Helper()
	s := policy.Snapshot{}
	for _, d := range docs {
		np := &networkingv1.NetworkPolicy{}
		if err := yaml.UnmarshalStrict([]byte(d), np); err != nil {
			t.Fatalf("bad policy: %v", err)
		}
		s.Policies = append(s.Policies, np)
	}
	return s
}

// probe runs "from>to proto/port" ("node" probes from the node; to may be
// "b6" for b's IPv6 address, TCP only) and reports whether it worked.
func (c *cluster) probe(check string) error {
	from, rest, _ := strings.Cut(check, ">")
	to, pp, _ := strings.Cut(rest, " ")
	proto, portS, _ := strings.Cut(pp, "/")
	port, _ := strconv.Atoi(portS)
	dst := podIPs[to]
	if name, ok := strings.CutSuffix(to, "6"); ok {
		dst = podIPs6[name]
	}
	if from == "node" {
		return testnet.ProbeFromNode(proto, dst, port)
	}
	p := c.pods[from]
	if dst.Is6() {
		return p.Do(func() error { return probe6(dst, port) })
	}
	return p.Probe(proto, dst, port)
}

// expect checks probes in parallel.
func (c *cluster) expect(allowed bool, checks ...string) {
	c.t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(checks))
	for i, check := range checks {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.probe(check) }()
	}
	wg.Wait()
	for i, check := range checks {
		if allowed && errs[i] != nil {
			c.t.Errorf("%s: want allowed, got %v", check, errs[i])
		}
		if !allowed && errs[i] == nil {
			c.t.Errorf("%s: want denied, got through", check)
		}
	}
}

func policyDoc(name, ns, spec string) string {
	return fmt.Sprintf("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: %s, namespace: %s}\nspec:\n%s", name, ns, spec)
}
