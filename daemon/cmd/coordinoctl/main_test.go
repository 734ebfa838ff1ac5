package main

import (
	"bytes"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	flowv1 "github.com/coordino/coordino/proto/flow/v1"
)

func TestParsePort(t *testing.T) {
	for in, want := range map[string]struct {
		port  uint32
		proto string
	}{"80/TCP": {80, "TCP"}, "53/udp": {53, "UDP"}, "5432": {5432, "TCP"}, "0/ICMP": {0, "ICMP"}} {
		p, proto, err := parsePort(in)
		if err != nil || p != want.port || proto != want.proto {
			t.Errorf("parsePort(%q) = %d %q %v", in, p, proto, err)
		}
	}
	for _, bad := range []string{"", "http/TCP", "70000/TCP", "-1"} {
		if _, _, err := parsePort(bad); err == nil {
			t.Errorf("parsePort(%q) accepted", bad)
		}
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	for _, args := range [][]string{
		{"nosuch"},
		{"status", "-o", "xml"},
		{"endpoint", "get"},
		{"status", "extra"},
		{"policy", "explain", "--from", "a", "--to", "b", "--port", "x/TCP", "--socket", "/nonexistent"},
		{"flows", "--verdict", "maybe", "--socket", "/nonexistent"},
		{"completion", "fish"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, errb.String())
		}
	}
}

func TestCompletionListsCommandsAndFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"completion", "bash"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"complete -F _coordinoctl coordinoctl", "explain", "--follow", "--since", "-o", "bugtool"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("completion lacks %q", want)
		}
	}
}

// silentSocket accepts connections and never answers, like a hung daemon.
func silentSocket(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "inspect.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return sock
}

// runTimed runs coordinoctl and reports its exit code, stderr and duration.
func runTimed(args ...string) (int, string, string, time.Duration) {
	var out, errb bytes.Buffer
	start := time.Now()
	code := run(args, &out, &errb)
	return code, out.String(), errb.String(), time.Since(start)
}

// --timeout, not gRPC's 20 s connection limit, ends a call to a daemon that
// accepts but never answers, with a message that says so.
func TestTimeoutAgainstASilentDaemon(t *testing.T) {
	t.Run("status waits --timeout beyond gRPC's 20 s", func(t *testing.T) {
		t.Parallel()
		code, _, stderr, took := runTimed("status", "--timeout", "22s", "--socket", silentSocket(t))
		if code != 1 || took < 21*time.Second || took > 27*time.Second || !strings.Contains(stderr, "did not answer within 22s") {
			t.Fatalf("exit %d after %v: %s", code, took, stderr)
		}
	})
	t.Run("flows --follow gives up after --timeout", func(t *testing.T) {
		t.Parallel()
		code, _, stderr, took := runTimed("flows", "--follow", "--timeout", "2s", "--socket", silentSocket(t))
		if code != 1 || took > 5*time.Second || !strings.Contains(stderr, "did not answer within 2s") {
			t.Fatalf("exit %d after %v: %s", code, took, stderr)
		}
	})
}

// quietObserver answers FollowFlows at once, then sends one event after
// a pause longer than the client's --timeout.
type quietObserver struct {
	flowv1.UnimplementedObserverServer
	pause time.Duration
}

func (q quietObserver) FollowFlows(_ *flowv1.FollowFlowsRequest, s flowv1.Observer_FollowFlowsServer) error {
	if err := s.SendHeader(nil); err != nil {
		return err
	}
	time.Sleep(q.pause)
	return s.Send(&flowv1.FlowEvent{TimeUnixNano: 1, Verdict: "dropped", Endpoint: "n/c/eth0", Dst: "10.0.0.1", DstPort: 80})
}

func serveGRPC(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	register(g)
	go g.Serve(l)
	t.Cleanup(g.Stop)
	return sock
}

// A healthy follow outlives --timeout.
func TestFollowOutlivesTimeout(t *testing.T) {
	sock := serveGRPC(t, func(g *grpc.Server) { flowv1.RegisterObserverServer(g, quietObserver{pause: 1500 * time.Millisecond}) })
	code, out, stderr, _ := runTimed("flows", "--follow", "--timeout", "500ms", "-o", "json", "--socket", sock)
	if code != 0 || !strings.Contains(out, `"dstPort":80`) {
		t.Fatalf("exit %d: %s\n%s", code, out, stderr)
	}
}

func TestConnectionErrorsSayWhatToDo(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "inspect.sock")
	stale := filepath.Join(dir, "stale.sock")
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	cni := serveGRPC(t, func(*grpc.Server) {})
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"status", "--socket", missing}, []string{"no daemon socket at " + missing, "--run-dir"}},
		{[]string{"--socket", missing, "status"}, []string{"no daemon socket at " + missing}},
		{[]string{"--socket=" + stale, "-o", "json", "ipam"}, []string{"not answering on " + stale, "--run-dir"}},
		{[]string{"status", "--socket", cni}, []string{cni + " is not the daemon's inspection socket", "inspect.sock"}},
	} {
		code, _, stderr, took := runTimed(c.args...)
		if code != 1 || took > 5*time.Second {
			t.Errorf("%v: exit %d after %v: %s", c.args, code, took, stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v: stderr lacks %q: %s", c.args, w, stderr)
			}
		}
		if strings.Contains(stderr, "transport:") || strings.Contains(stderr, "unknown command") {
			t.Errorf("%v: %s", c.args, stderr)
		}
	}
}

// A group without its subcommand shows the group's usage.
func TestCommandGroupsShowTheirUsage(t *testing.T) {
	for _, args := range [][]string{{"endpoint"}, {"policy"}, {"policy", "nosuch"}, {"endpoint", "--socket", "/x"}} {
		code, _, stderr, _ := runTimed(args...)
		if code != 2 || strings.Contains(stderr, "unknown command") || !strings.Contains(stderr, "coordinoctl "+args[0]+" ") ||
			!strings.Contains(stderr, map[string]string{"endpoint": "endpoint get", "policy": "policy explain"}[args[0]]) {
			t.Errorf("%v: exit %d: %s", args, code, stderr)
		}
	}
	if code, _, stderr, _ := runTimed("--bogus", "status"); code != 2 || !strings.Contains(stderr, "--bogus") {
		t.Errorf("unknown leading flag: exit %d: %s", code, stderr)
	}
}
