//go:build linux

package cluster

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// TestTrafficSeesGapsAndDeniedProbes: the upgrade test's instrument, on
// two namespaces joined by a veth: a clean run reports nothing, a link
// down for 1.5 s is reported as a silence over a second, and probes from
// an address named denied are reported as through (nothing here denies
// them). ~3 s.
func TestTrafficSeesGapsAndDeniedProbes(t *testing.T) {
	privileged.Require(t)
	sfx := harness.RandomSuffix(5)
	var nss [2]netns.NsHandle
	for i, side := range []string{"s", "c"} {
		h, err := newNamedNetns("cbt-" + sfx + side)
		if err != nil {
			t.Fatal(err)
		}
		name := "cbt-" + sfx + side
		t.Cleanup(func() { h.Close(); _ = netns.DeleteNamed(name) })
		nss[i] = h
	}
	server, client := netip.MustParseAddr("192.168.251.1"), netip.MustParseAddr("192.168.251.2")
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", Namespace: netlink.NsFd(nss[0])},
		PeerName: "eth0", PeerNamespace: netlink.NsFd(nss[1])}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	for i, a := range []netip.Addr{server, client} {
		if err := inNetns(nss[i], func() error {
			for _, n := range []string{"lo", "eth0"} {
				l, err := netlink.LinkByName(n)
				if err != nil {
					return err
				}
				if n == "eth0" {
					if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
						return err
					}
				}
				if err := netlink.LinkSetUp(l); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	tr := NewTraffic(9400, 9401)
	defer tr.Stop()
	if err := tr.Serve(nss[0]); err != nil {
		t.Fatal(err)
	}
	if err := tr.Flow(nss[1], server); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if r := tr.Report(); r.Flows != 2 || r.Problems(time.Second) != nil || len(r.Silent) > 0 {
		t.Fatalf("clean run: %d flows, silent %v, %v", r.Flows, r.Silent, r.Problems(time.Second))
	}
	setLink := func(up bool) {
		t.Helper()
		if err := inNetns(nss[1], func() error {
			l, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			if up {
				return netlink.LinkSetUp(l)
			}
			return netlink.LinkSetDown(l)
		}); err != nil {
			t.Fatal(err)
		}
	}
	setLink(false)
	time.Sleep(1500 * time.Millisecond)
	setLink(true)
	time.Sleep(1500 * time.Millisecond) // TCP retransmits within its backoff
	r := tr.Report()
	if err := r.Problems(time.Second); err == nil || !strings.Contains(err.Error(), "silent") {
		t.Errorf("1.5 s link down: %v, want a silence over 1 s (longest %s)", err, r.MaxGap)
	}
	if len(r.Resets) > 0 {
		t.Errorf("a link down reset connections: %v", r.Resets)
	}
	// Each flow's silence listed, ended after the link came back.
	if len(r.Silences) == 0 {
		t.Error("no silence listed for a 1.5 s link down")
	}
	for _, sl := range r.Silences {
		if sl.Len < time.Second || sl.Flow == "" {
			t.Errorf("silence %s: want a flow's silence over 1 s", sl)
		}
	}
	tr.Deny(client)
	tr.Probe(nss[1], server)
	time.Sleep(300 * time.Millisecond)
	if r := tr.Report(); len(r.Through) == 0 {
		t.Error("probes from a denied address were not reported through")
	}
}
