package e2e

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	inspectv1 "github.com/coordino/coordino/proto/inspect/v1"
	"github.com/coordino/coordino/test/harness"
)

// mapRow returns the status row of a BPF map.
func mapRow(t *testing.T, st *inspectv1.Status, name string) *inspectv1.MapPressure {
	t.Helper()
	for _, m := range st.Maps {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("status has no row for %s: %v", name, st.Maps)
	return nil
}

// TestEndpointsMapFullFailsAdd: a daemon with room for four endpoints
// refuses the fifth ADD with CNI code 11 naming the map and the flag,
// leaves nothing of it behind (veth, pin, address, record, pod interface),
// counts the refusal and reports it in coordinoctl status until a DEL makes
// room; the same ADD then succeeds.
func TestEndpointsMapFullFailsAdd(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.97.0.0/24"}, ExtraArgs: []string{"--endpoints-map-size", "4"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	_, rt1, _ := addPod(t, c, "p1")
	for _, name := range []string{"p2", "p3", "p4"} {
		addPod(t, c, name)
	}
	// STATUS tells the runtime before an ADD fails (code 50).
	var e *types.Error
	if err := c.Status(ctx(t)); !asCNI(err, &e) || e.Code != types.ErrPluginNotAvailable || !strings.Contains(e.Msg, "cdo_endpoints is full") {
		t.Fatalf("STATUS with a full endpoints map = %v", err)
	}
	p5 := newPod(t, "p5")
	rt5 := harness.RuntimeConf(p5, "eth0")
	_, err := c.Add(ctx(t), rt5)
	if !asCNI(err, &e) || e.Code != types.ErrTryAgainLater || !strings.Contains(e.Msg, "cdo_endpoints is full") || !strings.Contains(e.Msg, "--endpoints-map-size") {
		t.Fatalf("ADD into a full endpoints map = %v, want code 11 naming cdo_endpoints and --endpoints-map-size", err)
	}
	if err := n.Leaks(4); err != nil {
		t.Fatalf("the refused ADD left state: %v", err)
	}
	if err := p5.NS.Do(func(ns.NetNS) error {
		if _, err := netlink.LinkByName("eth0"); err == nil {
			return errors.New("eth0 left in the pod")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if v, err := n.Metric("coordino_bpf_map_update_failures_total", `map="cdo_endpoints"`, `reason="full"`); err != nil || v != 1 {
		t.Fatalf("coordino_bpf_map_update_failures_total{map=cdo_endpoints} = %v, %v; want 1", v, err)
	}
	var st inspectv1.Status
	ctlJSON(t, n, &st, "status")
	if row := mapRow(t, &st, "cdo_endpoints"); row.Entries != 4 || row.Capacity != 4 || row.UpdateFailures != 1 || !row.Refusing {
		t.Fatalf("cdo_endpoints row = %v, want 4/4 refusing with 1 failure", row)
	}
	if st.Verdict != "failing" || !strings.Contains(strings.Join(st.Problems, "\n"), "cdo_endpoints refuses updates") {
		t.Fatalf("verdict %q, problems %q", st.Verdict, st.Problems)
	}
	text, err := coordinoctl(t, n, "status")
	if err != nil || !strings.Contains(text, "REFUSING UPDATES") || !strings.Contains(text, "FAILING") {
		t.Fatalf("status text lacks the refusing map or the verdict: %v\n%s", err, text)
	}

	if err := c.Del(ctx(t), rt1); err != nil {
		t.Fatal(err)
	}
	if err := c.Status(ctx(t)); err != nil {
		t.Fatalf("STATUS after a DEL made room: %v", err)
	}
	ctlJSON(t, n, &st, "status")
	if row := mapRow(t, &st, "cdo_endpoints"); row.Refusing || row.UpdateFailures != 1 {
		t.Fatalf("after a DEL made room: row = %v", row)
	}
	if _, err := c.Add(ctx(t), rt5); err != nil {
		t.Fatalf("ADD after a DEL made room: %v", err)
	}
	if err := n.Leaks(4); err != nil {
		t.Fatal(err)
	}
}

// waitMetric polls the node's /metrics until the series reaches at least want.
func waitMetric(t *testing.T, n *harness.Node, want float64, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := n.Metric(name, labels...)
		if err == nil && v >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v (%v), want at least %v; log:\n%s", name, labels, v, err, want, n.LogTail(20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// expectDenied dials addr:port from netns for a while (the daemon retries
// a failed update every second, writing in another order each time) and
// fails at the first connection that passes.
func expectDenied(t *testing.T, netns ns.NetNS, addr netip.Addr, port int, what string) {
	t.Helper()
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); {
		if conn, err := harness.DialFrom(netns, "tcp", addr, port, 300*time.Millisecond); err == nil {
			conn.Close()
			t.Fatalf("%s: connection passed", what)
		}
	}
}

// expectAllowed waits up to 10 s for a connection to pass.
func expectAllowed(t *testing.T, netns ns.NetNS, addr netip.Addr, port int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := harness.DialFrom(netns, "tcp", addr, port, time.Second)
		if err == nil {
			conn.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not allowed within 10 s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// expectRefusing checks that status shows name refusing with the verdict failing.
func expectRefusing(t *testing.T, n *harness.Node, name string, refusing bool) {
	t.Helper()
	var st inspectv1.Status
	ctlJSON(t, n, &st, "status")
	row := mapRow(t, &st, name)
	if row.Refusing != refusing || row.UpdateFailures == 0 || refusing && st.Verdict != "failing" {
		t.Fatalf("status: %s row %v, verdict %q; want refusing=%v after refused writes", name, row, st.Verdict, refusing)
	}
}

const (
	denyDB = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db, namespace: default}
spec: {podSelector: {matchLabels: {role: db}}, policyTypes: [Ingress]}
`
	// dbFromWebWebEgress opens db to web and isolates web's egress, which
	// allows only the outside block on the given ports: web>db stays denied.
	dbFromWebWebEgress = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: db, namespace: default}
spec:
  podSelector: {matchLabels: {role: db}}
  ingress: [{from: [{podSelector: {matchLabels: {role: web}}}], ports: [{port: 5432}]}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-egress, namespace: default}
spec:
  podSelector: {matchLabels: {role: web}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 203.0.113.0/24}}], ports: [%s]}]
`
)

// TestPolicyMapFullDeniesTraffic: with a policy map of 8 entries, an update
// of 9 (db opened to web, web's egress isolated without db) cannot go in
// whole; whatever part of it the daemon writes, in whatever order its
// retries take, web>db stays denied. The refusal is counted and shown, and
// an update that fits goes through.
func TestPolicyMapFullDeniesTraffic(t *testing.T) {
	n, policyDir := newPolicyNode(t, harness.NodeOptions{PodCIDRs: []string{"10.98.0.0/24"}, ExtraArgs: []string{"--policy-map-size", "8"}},
		map[string]string{"db.yaml": denyDB})
	web, _, _ := addPod(t, newCNI(t, n, labelledConflist(t, n, map[string]string{"role": "web"})), "web")
	db, _, dbAddrs := addPod(t, newCNI(t, n, labelledConflist(t, n, map[string]string{"role": "db"})), "db")
	stop, err := harness.Serve(db.NS, dbAddrs[0], 5432, "db")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	expectDenied(t, web.NS, dbAddrs[0], 5432, "web>db under deny-all")

	ports := make([]string, 8)
	for i := range ports {
		ports[i] = fmt.Sprintf("{port: %d}", 1000+i)
	}
	if err := os.WriteFile(filepath.Join(policyDir, "db.yaml"), []byte(fmt.Sprintf(dbFromWebWebEgress, strings.Join(ports, ", "))), 0o600); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, n, 1, "coordino_bpf_map_update_failures_total", `map="cdo_policy"`, `reason="full"`)
	expectDenied(t, web.NS, dbAddrs[0], 5432, "web>db while the update does not fit")
	expectRefusing(t, n, "cdo_policy", true)

	// Fits: db opened to web, web's egress allowing db and two ports.
	fits := strings.Replace(fmt.Sprintf(dbFromWebWebEgress, "{port: 1000}, {port: 1001}"), "egress: [{to:",
		"egress: [{to: [{podSelector: {matchLabels: {role: db}}}], ports: [{port: 5432}]}, {to:", 1)
	if err := os.WriteFile(filepath.Join(policyDir, "db.yaml"), []byte(fits), 0o600); err != nil {
		t.Fatal(err)
	}
	expectAllowed(t, web.NS, dbAddrs[0], 5432, "web>db once the update fits")
	expectRefusing(t, n, "cdo_policy", false)
}

// linkLocalDst is an address of the node outside every pod and node
// identity (link scope: the daemon does not count it as the host), so the
// ipcache resolves it by ipBlock prefixes alone.
var linkLocalDst = netip.MustParseAddr("169.254.77.1")

const webToLinkLocal = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-egress, namespace: default}
spec:
  podSelector: {matchLabels: {role: web}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 169.254.77.0/24%s}}], ports: [{port: 7070}]}]
`

// TestIpcacheFullDeniesTraffic: web may reach 169.254.77.0/24. The daemon
// restarts with an ipcache exactly as large as its entries (the pinned map
// is copied into the smaller one and keeps enforcing), then the policy
// excepts 169.254.77.0/28 from the block: the exception does not fit. An
// address of the exception must then be denied, not keep resolving to the
// allowed /24.
func TestIpcacheFullDeniesTraffic(t *testing.T) {
	n, policyDir := newPolicyNode(t, harness.NodeOptions{PodCIDRs: []string{"10.99.0.0/24"}},
		map[string]string{"web.yaml": fmt.Sprintf(webToLinkLocal, "")})
	web, _, _ := addPod(t, newCNI(t, n, labelledConflist(t, n, map[string]string{"role": "web"})), "web")
	if err := n.NS.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: linkLocalDst.AsSlice(), Mask: net.CIDRMask(32, 32)}, Scope: int(netlink.SCOPE_LINK)})
	}); err != nil {
		t.Fatal(err)
	}
	stop, err := harness.ServeTCPEcho(n.NS, linkLocalDst, 7070)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	expectAllowed(t, web.NS, linkLocalDst, 7070, "web>169.254.77.1 in the allowed block")

	var st inspectv1.Status
	ctlJSON(t, n, &st, "status")
	entries := mapRow(t, &st, "cdo_ipcache").Entries
	if err := n.StopDaemon(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	n.ExtraArgs = append(n.ExtraArgs, "--ipcache-map-size", fmt.Sprint(entries))
	if err := n.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	ctlJSON(t, n, &st, "status")
	if row := mapRow(t, &st, "cdo_ipcache"); row.Capacity != entries || row.Entries != entries {
		t.Fatalf("after the resize: cdo_ipcache %v, want %d/%d", row, entries, entries)
	}
	expectAllowed(t, web.NS, linkLocalDst, 7070, "web>169.254.77.1 after the resize")

	if err := os.WriteFile(filepath.Join(policyDir, "web.yaml"), []byte(fmt.Sprintf(webToLinkLocal, ", except: [169.254.77.0/28]")), 0o600); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, n, 1, "coordino_bpf_map_update_failures_total", `map="cdo_ipcache"`, `reason="full"`)
	expectDenied(t, web.NS, linkLocalDst, 7070, "web>169.254.77.1 (excepted, the exception does not fit)")
	expectRefusing(t, n, "cdo_ipcache", true)
}
