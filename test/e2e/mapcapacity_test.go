package e2e

import (
	"errors"
	"strings"
	"testing"

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
	p5 := newPod(t, "p5")
	rt5 := harness.RuntimeConf(p5, "eth0")
	_, err := c.Add(ctx(t), rt5)
	var e *types.Error
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
