package datapath

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/coordino/coordino/daemon/internal/testnet"
)

// A daemon killed after recording an endpoint but before AttachEndpoint
// returned, and started again with the other attach mode, still clears the
// hooks the endpoint was attached with: the record written before the attach
// already names the mode.
func TestKilledMidAttachRecordNamesTheMode(t *testing.T) {
	c := newCluster(t, AttachTC)
	p := testnet.NewPod(t, "d", podIPs["d"])
	ep := Endpoint{Key: "net/d-" + filepath.Base(t.Name()) + "/eth0", HostIfName: p.HostIfName,
		HostIfIndex: p.HostIfIndex, IPs: p.IPs, Namespace: "default"}
	r, err := newRecord(ep)
	if err != nil {
		t.Fatal(err)
	}
	// AttachEndpoint up to the attach, then the daemon is gone.
	if err := c.dp.prepareAttach(r); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.att.attach(r); err != nil {
		t.Fatal(err)
	}
	if err := c.dp.Close(); err != nil {
		t.Fatal(err)
	}
	c.cfg.AttachMode = AttachTCX
	c.open()
	if err := c.dp.DetachEndpoint(ep); err != nil {
		t.Fatal(err)
	}
	if n := hookPrograms(t, ep.HostIfIndex); n != 0 {
		t.Fatalf("%d programs or filters left on the detached endpoint's hooks", n)
	}
}

// An ifindex that no longer names the interface the caller means is refused
// before anything is written.
func TestAttachRefusesStaleIfindex(t *testing.T) {
	c := newCluster(t, AttachTC)
	p := testnet.NewPod(t, "d", podIPs["d"])
	ep := Endpoint{Key: "net/d-" + filepath.Base(t.Name()) + "/eth0", HostIfName: "cdo-renamed",
		HostIfIndex: p.HostIfIndex, IPs: p.IPs, Namespace: "default"}
	err := c.dp.AttachEndpoint(ep)
	if err == nil || !strings.Contains(err.Error(), `is "`+p.HostIfName+`", not "cdo-renamed"`) {
		t.Fatalf("attach under another interface's name = %v, want it refused naming both", err)
	}
	ep.HostIfName, ep.HostIfIndex = p.HostIfName, 1<<30
	if err := c.dp.AttachEndpoint(ep); err == nil || !strings.Contains(err.Error(), "host interface 1073741824") {
		t.Fatalf("attach to a missing ifindex = %v, want it refused", err)
	}
	if keys, _ := c.dp.Endpoints(); len(keys) != 3 {
		t.Fatalf("endpoints after refused attaches: %v, want only a, b and c", keys)
	}
}

// BenchmarkAttachDetach is one pod's attach and detach (tc mode, an empty
// conntrack table): its allocations are the GC work the datapath adds per
// pod.
func BenchmarkAttachDetach(b *testing.B) {
	c := newCluster(b, AttachTC)
	p := testnet.NewPod(b, "d", podIPs["d"])
	ep := Endpoint{Key: "net/d-" + filepath.Base(b.Name()) + "/eth0", HostIfName: p.HostIfName,
		HostIfIndex: p.HostIfIndex, IPs: p.IPs, Namespace: "default", Labels: map[string]string{"app": "x"}}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := c.dp.AttachEndpoint(ep); err != nil {
			b.Fatal(err)
		}
		if err := c.dp.DetachEndpoint(ep); err != nil {
			b.Fatal(err)
		}
	}
}
