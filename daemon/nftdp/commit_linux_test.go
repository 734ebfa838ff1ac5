package nftdp

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coordino/coordino/daemon/datapath/dpapi"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/internal/testnet"
)

// holdFirstCommit keeps the next transaction in the kernel until want
// attaches wait behind it, so they meet in the one after.
func holdFirstCommit(t *testing.T, c *cluster, want int) {
	var once sync.Once
	testBeforeCommit = func() {
		once.Do(func() {
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				c.dp.mu.Lock()
				n := len(c.dp.waiting)
				c.dp.mu.Unlock()
				if n >= want {
					return
				}
				time.Sleep(time.Millisecond)
			}
			t.Errorf("%d attaches never waited behind the commit in flight", want)
		})
	}
	t.Cleanup(func() { testBeforeCommit = nil })
}

// fakeEndpoints are n endpoints on interfaces that do not exist (the
// table does not care), each a label set of its own.
func fakeEndpoints(t testing.TB, n int) []dpapi.Endpoint {
	var out []dpapi.Endpoint
	for i := range n {
		out = append(out, dpapi.Endpoint{Key: fmt.Sprintf("net/batch-%d-%s/eth0", i, t.Name()), HostIfName: fmt.Sprintf("cdtb%d", i),
			IPs: []netip.Addr{netip.AddrFrom4([4]byte{198, 51, 100, byte(100 + i)})}, Namespace: "default",
			Labels: map[string]string{"app": "batch", "pod": fmt.Sprint(i)}})
	}
	return out
}

// attachAll attaches eps concurrently and returns each one's error.
func attachAll(c *cluster, eps []dpapi.Endpoint) []error {
	errs := make([]error, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.dp.AttachEndpoint(ep) }()
	}
	wg.Wait()
	return errs
}

// TestConcurrentAttachesShareTransactions: attaches arriving while a
// transaction is in the kernel are committed together in the next one,
// and each is enforced when it returns.
func TestConcurrentAttachesShareTransactions(t *testing.T) {
	c := newCluster(t, false)
	c.policies(serverFromClientsOn80)
	d := testnet.NewPod(t, "d", podIPs["d"])
	c.pods["d"] = d
	eps := append(fakeEndpoints(t, 15), dpapi.Endpoint{Key: "net/d-batch/eth0", HostIfName: d.HostIfName,
		HostIfIndex: d.HostIfIndex, IPs: d.IPs, Namespace: "default", Labels: map[string]string{"app": "client"}})
	holdFirstCommit(t, c, len(eps)-1)
	before, batchedBefore := c.dp.stats.transactions, c.dp.stats.batched
	for i, err := range attachAll(c, eps) {
		if err != nil {
			t.Errorf("attach %s: %v", eps[i].Key, err)
		}
	}
	if n, b := c.dp.stats.transactions-before, c.dp.stats.batched-batchedBefore; n != 2 || b != uint64(len(eps)) {
		t.Errorf("%d attaches took %d transactions carrying %d, want 2 carrying all", len(eps), n, b)
	}
	if keys, _ := c.dp.Endpoints(); len(keys) != 3+len(eps) {
		t.Errorf("%d endpoints attached, want %d", len(keys), 3+len(eps))
	}
	c.expect(true, "d>b tcp/80")
	c.expect(false, "d>b tcp/81", "c>b tcp/80")
}

// TestRefusedBatchFailsOnlyItsCulprit: when the kernel refuses a batch,
// nothing of it applies, and its attaches try again alone: the one the
// kernel refuses fails with its own error, the others succeed, and the
// refused one leaves nothing more open (here: b moved to labels no
// policy selects would lose its isolation).
func TestRefusedBatchFailsOnlyItsCulprit(t *testing.T) {
	c := newCluster(t, false)
	c.policies(serverFromClientsOn80)
	c.expect(false, "c>b tcp/80")
	d := testnet.NewPod(t, "d", podIPs["d"])
	c.pods["d"] = d
	open := c.eps["b"]
	open.Labels = map[string]string{"app": "open"}
	eps := append(fakeEndpoints(t, 14), open, dpapi.Endpoint{Key: "net/d-batch/eth0", HostIfName: d.HostIfName,
		HostIfIndex: d.HostIfIndex, IPs: d.IPs, Namespace: "default", Labels: map[string]string{"app": "client"}})
	// The kernel refuses any transaction that would write b's move.
	testFailTransaction = func() bool {
		r := c.dp.eps[open.Key]
		return r != nil && r.Labels["app"] == "open"
	}
	t.Cleanup(func() { testFailTransaction = nil })
	holdFirstCommit(t, c, len(eps)-1)
	failures := c.dp.stats.failures
	for i, err := range attachAll(c, eps) {
		switch {
		case eps[i].Key == open.Key && (err == nil || !strings.Contains(err.Error(), open.Key)):
			t.Errorf("the refused attach returned %v, want an error naming %s", err, open.Key)
		case eps[i].Key != open.Key && err != nil:
			t.Errorf("attach %s failed with its batch: %v", eps[i].Key, err)
		}
	}
	if c.dp.stats.failures == failures {
		t.Error("no transaction was refused")
	}
	if keys, _ := c.dp.Endpoints(); len(keys) != 3+len(eps)-1 {
		t.Errorf("%d endpoints attached, want %d", len(keys), 3+len(eps)-1)
	}
	c.expect(true, "d>b tcp/80", "a>b tcp/80")
	c.expect(false, "c>b tcp/80", "d>b tcp/81")
	// Nothing of it stays pending either: the next change keeps b isolated.
	c.policies(serverFromClientsOn80)
	c.expect(false, "c>b tcp/80")
}

// TestConcurrentChangesKeepTheMirror: attaches, detaches and policy
// changes from many goroutines, batched or not, leave the table as the
// datapath's mirror says (a second Open reads the kernel's back), and a
// repeated snapshot has nothing left to write.
func TestConcurrentChangesKeepTheMirror(t *testing.T) {
	c := newCluster(t, false)
	eps := fakeEndpoints(t, 24)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 60 {
				ep := eps[w*3+rng.IntN(3)]
				ep.Labels = map[string]string{"app": []string{"client", "server", "batch"}[rng.IntN(3)], "x": fmt.Sprint(rng.IntN(2))}
				var err error
				if rng.IntN(3) == 0 {
					err = c.dp.DetachEndpoint(ep)
				} else {
					err = c.dp.AttachEndpoint(ep)
				}
				if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 30 {
			var docs []string
			if i%2 == 0 {
				docs = []string{serverFromClientsOn80}
			}
			if err := c.dp.UpdatePolicy(snapshotOf(t, docs...)); err != nil {
				t.Error(err)
			}
		}
	}()
	wg.Wait()
	c.policies(serverFromClientsOn80)
	before := c.dp.stats.transactions
	c.policies(serverFromClientsOn80)
	if c.dp.stats.transactions != before {
		t.Error("a repeated snapshot wrote a transaction")
	}
	// The doomed objects are in the table, and nothing else is left when
	// the sweep has deleted them.
	c.dp.mu.Lock()
	have, err := c.dp.objects()
	for o := range c.dp.doomed {
		if _, ok := have[o]; !ok {
			t.Errorf("doomed %+v not in the table", o)
		}
	}
	c.dp.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	c.sweep()
	kernel, err := Open(c.cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.dp.mu.Lock()
	defer c.dp.mu.Unlock()
	mirror := c.dp.inst
	if !maps.EqualFunc(kernel.inst.pods, mirror.pods, maps.Equal) || !maps.Equal(kernel.inst.src, mirror.src) ||
		!maps.Equal(kernel.inst.cidrs, mirror.cidrs) || !maps.Equal(kernel.inst.locals, mirror.locals) ||
		len(kernel.inst.eps) != len(mirror.eps) || len(kernel.eps) != len(c.dp.eps) || len(kernel.doomed) > 0 {
		t.Errorf("the table and the mirror differ:\nkernel %+v\nmirror %+v", kernel.inst, mirror)
	}
	for g := range kernel.inst.pairs {
		if _, ok := mirror.pairs[g]; !ok && g.remote != identity.Any { // any-peer chains go with their identity's maps
			t.Errorf("chain %s in the table, not in the mirror", pairChain(g))
		}
	}
	for g := range mirror.pairs {
		if _, ok := kernel.inst.pairs[g]; !ok {
			t.Errorf("chain %s in the mirror, not in the table", pairChain(g))
		}
	}
}
