package e2e

import (
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/coordino/coordino/proto/deletequeue"
	"github.com/coordino/coordino/test/harness"
)

func TestGCReclaimsOnlyInvalidAttachmentsOfItsNetwork(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.84.0.0/24"}})
	a := newCNI(t, n, n.PrimaryConflist("net-a", "1.1.0"))
	b := newCNI(t, n, n.PrimaryConflist("net-b", "1.1.0"))
	_, keep, _ := addPod(t, a, "keep")
	_, drop, _ := addPod(t, a, "drop")
	_, other, _ := addPod(t, b, "other")
	// A fresh runtime cache: GC itself, not libcni's cached DELs, must do the work.
	fresh, err := n.NewCNI(n.PrimaryConflist("net-a", "1.1.0"))
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.GC(ctx(t), []types.GCAttachment{{ContainerID: keep.ContainerID, IfName: "eth0"}}); err != nil {
		t.Fatal(err)
	}
	if err := n.Leaks(2); err != nil {
		t.Fatal(err)
	}
	if err := a.Check(ctx(t), keep); err != nil {
		t.Fatalf("GC broke a valid attachment: %v", err)
	}
	if err := b.Check(ctx(t), other); err != nil {
		t.Fatalf("GC of net-a touched net-b: %v", err)
	}
	if err := a.Check(ctx(t), drop); err == nil {
		t.Fatal("reclaimed attachment still checks out")
	}
}

func TestDelWhileDaemonDownIsAppliedAfterRestart(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.85.0.0/24"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	a, _, addrsA := addPod(t, c, "a")
	b, rtB, addrsB := addPod(t, c, "b")
	stop, err := harness.Serve(a.NS, addrsA[0], 80, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := n.StopDaemon(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Existing pods keep talking while the daemon is away.
	if got, err := harness.Dial(b.NS, addrsA[0], 80); err != nil || got != "a" {
		t.Fatalf("pod→pod with daemon down: %q %v", got, err)
	}
	if got, err := harness.Dial(n.NS, addrsA[0], 80); err != nil || got != "a" {
		t.Fatalf("node→pod with daemon down: %q %v", got, err)
	}
	// DEL succeeds at once and is queued durably.
	start := time.Now()
	if err := c.Del(ctx(t), rtB); err != nil {
		t.Fatalf("DEL with daemon down: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("DEL with daemon down took %v", took)
	}
	queued, _ := deletequeue.Paths(filepath.Join(n.RunDir, "delete-queue"))
	if len(queued) != 1 {
		t.Fatalf("queued DELs = %v", queued)
	}
	if err := n.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	queued, _ = filepath.Glob(filepath.Join(n.RunDir, "delete-queue", "*"))
	if len(queued) != 0 {
		t.Fatalf("queue not drained before serving: %v", queued)
	}
	if err := n.Leaks(1); err != nil {
		t.Fatal(err)
	}
	// B's address is free again: the next pod may get it eventually, and A still works.
	if got, err := harness.Dial(n.NS, addrsA[0], 80); err != nil || got != "a" {
		t.Fatalf("node→pod after restart: %q %v", got, err)
	}
	_ = addrsB
}

// TestCrashDuringAddLeaksNothing kills the daemon at random moments while
// ADDs are in flight, restarts it, runs GC with the attachments the runtime
// believes in, and checks that nothing else remains.
func TestCrashDuringAddLeaksNothing(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.86.0.0/24"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	valid := map[string]*libcni.RuntimeConf{}
	interrupted := 0
	for round := 0; round < 6; round++ {
		pods := make([]*harness.Pod, 8)
		for i := range pods {
			pods[i] = newPod(t, fmt.Sprintf("r%dp%d", round, i))
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		firstDone := make(chan struct{})
		var once sync.Once
		for _, p := range pods {
			wg.Add(1)
			go func(p *harness.Pod) {
				defer wg.Done()
				rt := harness.RuntimeConf(p, "eth0")
				_, err := c.Add(ctx(t), rt)
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					valid[rt.ContainerID] = rt
					once.Do(func() { close(firstDone) })
				} else {
					interrupted++
				}
			}(p)
		}
		// Kill once ADDs are demonstrably being served, at a random point among the rest.
		select {
		case <-firstDone:
		case <-time.After(10 * time.Second):
		}
		time.Sleep(time.Duration(rand.Intn(8)) * time.Millisecond)
		if err := n.StopDaemon(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if err := n.StartDaemon(); err != nil {
			t.Fatal(err)
		}
		var gcValid []types.GCAttachment
		for id := range valid {
			gcValid = append(gcValid, types.GCAttachment{ContainerID: id, IfName: "eth0"})
		}
		if err := c.GC(ctx(t), gcValid); err != nil {
			t.Fatalf("round %d GC: %v", round, err)
		}
		if err := n.Leaks(len(valid)); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, rt := range valid {
			if err := c.Check(ctx(t), rt); err != nil {
				t.Fatalf("round %d: surviving pod %s broken: %v", round, rt.ContainerID, err)
			}
		}
	}
	t.Logf("%d pods attached, %d ADDs interrupted by a crash", len(valid), interrupted)
	if interrupted == 0 {
		t.Log("no ADD was in flight at a kill; the crash path was not exercised this run")
	}
}

func TestRestartReclaimsOrphans(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.87.0.0/24"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	_, rt, _ := addPod(t, c, "keep")
	if err := n.StopDaemon(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// What a crash between kernel changes and the store could leave: a host
	// veth and a netns pin no record names.
	if err := n.NS.Do(func(ns.NetNS) error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "cdo0rphan0000aa"}, PeerName: "orphanpeer"})
	}); err != nil {
		t.Fatal(err)
	}
	orphanPin := filepath.Join(n.RunDir, "netns", "cdo0rphan0000aa")
	os.WriteFile(orphanPin, nil, 0o600)
	src := newPod(t, "src")
	if err := syscall.Mount(src.NS.Path(), orphanPin, "none", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := n.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	if err := n.Leaks(1); err != nil {
		t.Fatal(err)
	}
	if err := c.Check(ctx(t), rt); err != nil {
		t.Fatalf("restart reconciliation broke a valid pod: %v", err)
	}
	if !n.LogContains("orphan host veth") || !n.LogContains("orphan netns pin") {
		t.Fatal("reconciliation did not log what it removed")
	}
}

func TestMetricsAndHealth(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.88.0.0/24"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	_, rt, _ := addPod(t, c, "p")
	if err := c.Del(ctx(t), rt); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body, err := n.HTTPGet(path); err != nil || code != 200 {
			t.Fatalf("%s = %d %q %v", path, code, body, err)
		}
	}
	_, body, err := n.HTTPGet("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`coordino_cni_request_duration_seconds_count{code="0",verb="ADD"} 1`,
		`coordino_cni_request_duration_seconds_count{code="0",verb="DEL"} 1`,
		`coordino_ipam_addresses{block="10.88.0.0/24",family="ipv4",state="free"} 254`,
		`coordino_endpoints{mode="primary"} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestSocketIsRootOnly(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.89.0.0/24"}})
	for path, want := range map[string]os.FileMode{
		n.RunDir:                                 os.ModeDir | 0o700,
		filepath.Join(n.RunDir, "coordino.sock"): os.ModeSocket | 0o600,
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s mode = %v, want %v", path, fi.Mode(), want)
		}
	}
}
