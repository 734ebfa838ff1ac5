package routewatch

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap/zaptest"

	"github.com/coordino/coordino/test/privileged"
)

// TestWatch: a change to a link, a route or a rule of the watched namespace
// is told; nothing is told once the watch ends.
func TestWatch(t *testing.T) {
	ns, h := privileged.NewNetns(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	told := make(chan struct{}, 1024)
	if err := Watch(ctx, ns, func() { told <- struct{}{} }, zaptest.NewLogger(t)); err != nil {
		t.Fatal(err)
	}
	expect := func(what string) {
		t.Helper()
		select {
		case <-told:
		case <-time.After(2 * time.Second):
			t.Fatalf("%s: not told", what)
		}
	}
	quiet := func() {
		for {
			select {
			case <-told:
			case <-time.After(100 * time.Millisecond):
				return
			}
		}
	}
	expect("start")

	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "rw0"}, PeerName: "rw1"}
	if err := h.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	expect("link added")
	quiet()
	if err := h.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	expect("link up")
	quiet()
	_, dst, _ := net.ParseCIDR("10.99.0.0/24")
	if err := h.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst}); err != nil {
		t.Fatal(err)
	}
	expect("route added")
	quiet()
	rule := netlink.NewRule()
	rule.Table, rule.Priority, rule.Src = 100, 100, dst
	if err := h.RuleAdd(rule); err != nil {
		t.Fatal(err)
	}
	expect("rule added")
	quiet()

	cancel()
	time.Sleep(100 * time.Millisecond)
	quiet()
	if err := h.LinkSetDown(link); err != nil {
		t.Fatal(err)
	}
	select {
	case <-told:
		t.Fatal("told after the watch ended")
	case <-time.After(300 * time.Millisecond):
	}
}
