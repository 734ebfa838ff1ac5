package skew

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

// build is one side's binaries.
type build struct {
	name      string
	pluginDir string // holds "coordino"
	daemon    string // "" is bin/coordino-daemon
}

func builds(t *testing.T) (prev, cur build) {
	privileged.Require(t)
	if err := harness.RequireBinaries(); err != nil {
		t.Fatal(err)
	}
	dir := harness.PreviousRelease(t)
	return build{name: "previous", pluginDir: dir, daemon: filepath.Join(dir, "coordino-daemon")},
		build{name: "current", pluginDir: harness.BinDir()}
}

func newNode(t *testing.T, cidrs []string, daemon string) *harness.Node {
	t.Helper()
	n, err := harness.NewNode(t.TempDir(), "skew-"+harness.RandomSuffix(6), harness.NodeOptions{PodCIDRs: cidrs, DaemonBinary: daemon})
	if err != nil {
		t.Fatal(err)
	}
	// Most of a start is the verifier's, minutes on a machine busy with
	// builds: these tests judge what a start does, not how fast.
	n.StartTimeout = time.Minute
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log tail:\n%s", n.LogTail(60))
		}
		n.Close()
	})
	if err := n.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	return n
}

func newCNI(t *testing.T, n *harness.Node, plugin build) *harness.CNI {
	t.Helper()
	c, err := n.NewCNI(n.PrimaryConflist("coordino", "1.1.0"), plugin.pluginDir, harness.RefBinDir())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), privileged.Slowdown(30*time.Second))
	t.Cleanup(cancel)
	return c
}

type pod struct {
	*harness.Pod
	rt    *libcni.RuntimeConf
	addrs []netip.Addr
}

func addPod(t *testing.T, c *harness.CNI, name string) *pod {
	t.Helper()
	p, err := harness.NewPod(name + "-" + harness.RandomSuffix(4))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	rt := harness.RuntimeConf(p, "eth0")
	res, err := c.Add(ctx(t), rt)
	if err != nil {
		t.Fatalf("ADD %s: %v", name, err)
	}
	addrs, err := harness.Addresses(res)
	if err != nil {
		t.Fatal(err)
	}
	return &pod{Pod: p, rt: rt, addrs: addrs}
}

// TestPluginDaemonSkew drives ADD, CHECK, GC, DEL (delivered, and queued
// while the daemon is away) and STATUS through libcni with the plugin and
// the daemon of the previous release and of this tree in all four pairings, as a node sees them while the installer
// copies the new plugin and the DaemonSet rolls.
func TestPluginDaemonSkew(t *testing.T) {
	prev, cur := builds(t)
	for _, plugin := range []build{prev, cur} {
		for _, daemon := range []build{prev, cur} {
			t.Run("plugin-"+plugin.name+"/daemon-"+daemon.name, func(t *testing.T) {
				n := newNode(t, []string{"10.140.0.0/24", "fd40::/64"}, daemon.daemon)
				c := newCNI(t, n, plugin)
				if err := c.Status(ctx(t)); err != nil {
					t.Fatalf("STATUS: %v", err)
				}
				a := addPod(t, c, "a")
				b := addPod(t, c, "b")
				if len(a.addrs) != 2 {
					t.Fatalf("dual-stack pod got %v", a.addrs)
				}
				stop, err := harness.Serve(a.NS, a.addrs[0], 80, "a")
				if err != nil {
					t.Fatal(err)
				}
				defer stop()
				if got, err := harness.Dial(b.NS, a.addrs[0], 80); err != nil || got != "a" {
					t.Fatalf("b→a: %q, %v", got, err)
				}
				for _, p := range []*pod{a, b} {
					if err := c.Check(ctx(t), p.rt); err != nil {
						t.Fatalf("CHECK %s: %v", p.Name, err)
					}
				}
				// GC from a runtime with a fresh cache: only a is valid.
				fresh := newCNI(t, n, plugin)
				if err := fresh.GC(ctx(t), []types.GCAttachment{{ContainerID: a.ContainerID, IfName: "eth0"}}); err != nil {
					t.Fatalf("GC: %v", err)
				}
				if err := n.Leaks(1); err != nil {
					t.Fatalf("after GC: %v", err)
				}
				if err := c.Check(ctx(t), b.rt); err == nil {
					t.Fatal("CHECK of the attachment GC reclaimed succeeded")
				}
				// A DEL while the daemon is away: the plugin queues it and
				// the daemon applies it at start, whichever wrote the record.
				if err := n.StopDaemon(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				if err := c.Del(ctx(t), a.rt); err != nil {
					t.Fatalf("DEL with the daemon away: %v", err)
				}
				if err := n.StartDaemon(); err != nil {
					t.Fatal(err)
				}
				if err := n.Leaks(0); err != nil {
					t.Fatalf("after the queued DEL: %v", err)
				}
				if err := c.Del(ctx(t), a.rt); err != nil {
					t.Fatalf("second DEL: %v", err)
				}
			})
		}
	}
}

// echo is a long-lived TCP connection between two pods: what a restart
// must not reset.
type echo struct {
	conn net.Conn
	r    *bufio.Reader
	n    int
}

func openEcho(t *testing.T, server, client *pod, port int) *echo {
	t.Helper()
	stop, err := harness.ServeTCPEcho(server.NS, server.addrs[0], port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	conn, err := harness.DialFrom(client.NS, "tcp", server.addrs[0], port, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e := &echo{conn: conn, r: bufio.NewReader(conn)}
	if err := e.roundTrip(); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *echo) roundTrip() error {
	e.n++
	msg := fmt.Sprintf("ping %d\n", e.n)
	_ = e.conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := e.conn.Write([]byte(msg)); err != nil {
		return fmt.Errorf("established connection: write: %w", err)
	}
	got, err := e.r.ReadString('\n')
	if err != nil || got != msg {
		return fmt.Errorf("established connection: read %q, %v; want %q", got, err, msg)
	}
	return nil
}

// restartCost is one measured daemon replacement.
type restartCost struct {
	stop, serve, add time.Duration // SIGTERM → exit, start → serving, first ADD
	programLoad      string        // as the new daemon logged it
}

func (r restartCost) total() time.Duration { return r.stop + r.serve + r.add }

// replace stops n's daemon with SIGTERM and starts daemon in its place,
// then ADDs a pod: the time from SIGTERM to that ADD's result is what a
// node's pods wait while a daemon is replaced.
func replace(t *testing.T, n *harness.Node, c *harness.CNI, daemon build, name string) (*pod, restartCost) {
	t.Helper()
	var cost restartCost
	start := time.Now()
	if err := n.StopDaemon(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	cost.stop = time.Since(start)
	n.DaemonBinary = daemon.daemon
	offset := logSize(n)
	start = time.Now()
	if err := n.StartDaemon(); err != nil {
		t.Fatalf("start the %s daemon on the state left: %v", daemon.name, err)
	}
	cost.serve = time.Since(start)
	cost.programLoad = programLoad(n, offset)
	start = time.Now()
	p := addPod(t, c, name)
	cost.add = time.Since(start)
	return p, cost
}

var programLoadRE = regexp.MustCompile(`"msg":"datapath opened".*"programLoad":([0-9.]+),"programsReused":(true|false)`)

// programLoad is the program load time a daemon logged in n's log after
// offset (daemons before the field: "not logged").
func programLoad(n *harness.Node, offset int64) string {
	data, _ := os.ReadFile(filepath.Join(n.Dir, "daemon.log"))
	if int64(len(data)) < offset {
		return "not logged"
	}
	m := programLoadRE.FindSubmatch(data[offset:])
	if m == nil {
		return "not logged"
	}
	s, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		return "not logged"
	}
	how := "loaded"
	if string(m[2]) == "true" {
		how = "reused"
	}
	return time.Duration(s*float64(time.Second)).Round(time.Millisecond).String() + " " + how
}

func logSize(n *harness.Node) int64 {
	fi, err := os.Stat(filepath.Join(n.Dir, "daemon.log"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// TestUpgradeRestartRollback replaces a node's daemon under an open TCP
// connection: previous → current (upgrade), current → current (a restart
// with the BPF programs unchanged), current → previous (rollback) and
// forward again. Each daemon adopts the endpoints the other left (CHECK
// passes, DEL works, addresses are not reused) and the connection is never
// broken; a daemon meeting the programs its build pinned reuses them. It
// logs the time from SIGTERM to the next daemon's first ADD.
func TestUpgradeRestartRollback(t *testing.T) {
	prev, cur := builds(t)
	n := newNode(t, []string{"10.141.0.0/24"}, prev.daemon)
	c := newCNI(t, n, cur) // the installer copies the plugin first
	a := addPod(t, c, "a")
	b := addPod(t, c, "b")
	conn := openEcho(t, a, b, 7000)
	stop, err := harness.Serve(a.NS, a.addrs[0], 80, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	pods := []*pod{a, b}

	for i, step := range []struct {
		name   string
		daemon build
		reuse  bool // the programs the last start of this build pinned
	}{
		{"upgrade previous→current", cur, false},
		{"restart current→current", cur, true},
		{"rollback current→previous", prev, false},
		{"upgrade again previous→current", cur, true},
	} {
		p, cost := replace(t, n, c, step.daemon, fmt.Sprintf("p%d", i))
		if reused := strings.HasSuffix(cost.programLoad, "reused"); reused != step.reuse {
			t.Errorf("%s: programs %s, want reused %v", step.name, cost.programLoad, step.reuse)
		}
		t.Logf("%s: SIGTERM→ADD result %v (stop %v, start→serving %v of which maps and programs %s, ADD %v)",
			step.name, cost.total().Round(time.Millisecond), cost.stop.Round(time.Millisecond),
			cost.serve.Round(time.Millisecond), cost.programLoad, cost.add.Round(time.Millisecond))
		for _, q := range pods {
			if q.addrs[0] == p.addrs[0] {
				t.Fatalf("%s: ADD got %v, the address of %s attached by the daemon before", step.name, p.addrs[0], q.Name)
			}
		}
		if err := conn.roundTrip(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		for _, q := range pods {
			if err := c.Check(ctx(t), q.rt); err != nil {
				t.Fatalf("%s: CHECK %s, attached by an earlier daemon: %v", step.name, q.Name, err)
			}
		}
		// The newest pod of the daemon before goes under this one.
		last := pods[len(pods)-1]
		if last != b {
			if err := c.Del(ctx(t), last.rt); err != nil {
				t.Fatalf("%s: DEL %s: %v", step.name, last.Name, err)
			}
			pods = pods[:len(pods)-1]
		}
		pods = append(pods, p)
		if got, err := harness.Dial(p.NS, a.addrs[0], 80); err != nil || got != "a" {
			t.Fatalf("%s: new pod → a: %q, %v", step.name, got, err)
		}
		if err := n.Leaks(len(pods)); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
	}
	for _, q := range pods {
		if err := c.Del(ctx(t), q.rt); err != nil {
			t.Fatalf("DEL %s: %v", q.Name, err)
		}
	}
	if err := n.Leaks(0); err != nil {
		t.Fatal(err)
	}
}
