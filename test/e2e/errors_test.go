package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/privileged"
)

func pluginConf(runDir string, extra map[string]any) []byte {
	m := map[string]any{"cniVersion": "1.1.0", "name": "coordino", "type": "coordino", "runDir": runDir}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return b
}

func TestInputErrorsCarrySpecCodes(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.81.0.0/24"}})
	p := newPod(t, "p")
	notNS := filepath.Join(t.TempDir(), "file")
	os.WriteFile(notNS, nil, 0o600)
	good := pluginConf(n.RunDir, nil)
	cases := []struct {
		name string
		inv  harness.Invocation
		code uint
		msg  string
	}{
		{"missing netns", harness.Invocation{Command: "ADD", ContainerID: "c1", IfName: "eth0", Stdin: good, Omit: []string{"CNI_NETNS"}}, types.ErrInvalidEnvironmentVariables, "CNI_NETNS"},
		{"bad container id", harness.Invocation{Command: "ADD", ContainerID: "bad id!", Netns: p.NS.Path(), IfName: "eth0", Stdin: good}, types.ErrInvalidEnvironmentVariables, "containerID"},
		{"bad ifname", harness.Invocation{Command: "ADD", ContainerID: "c1", Netns: p.NS.Path(), IfName: "eth0/x", Stdin: good}, types.ErrInvalidEnvironmentVariables, "interface name"},
		{"long ifname", harness.Invocation{Command: "ADD", ContainerID: "c1", Netns: p.NS.Path(), IfName: "abcdefghijklmnop", Stdin: good}, types.ErrInvalidEnvironmentVariables, "interface name"},
		{"bad json", harness.Invocation{Command: "ADD", ContainerID: "c1", Netns: p.NS.Path(), IfName: "eth0", Stdin: []byte("{nope")}, types.ErrDecodingFailure, ""},
		{"relative runDir", harness.Invocation{Command: "ADD", ContainerID: "c1", Netns: p.NS.Path(), IfName: "eth0", Stdin: pluginConf("run", nil)}, types.ErrInvalidNetworkConfig, "runDir"},
		{"untrusted runDir", harness.Invocation{Command: "ADD", ContainerID: "c1", Netns: p.NS.Path(), IfName: "eth0", Stdin: pluginConf("/etc/coordino", nil)}, types.ErrInvalidNetworkConfig, "runDir"},
		{"bad mtu", harness.Invocation{Command: "ADD", ContainerID: "c1", Netns: p.NS.Path(), IfName: "eth0", Stdin: pluginConf(n.RunDir, map[string]any{"mtu": 70000})}, types.ErrInvalidNetworkConfig, "mtu"},
		{"netns not a namespace", harness.Invocation{Command: "ADD", ContainerID: "c1", Netns: notNS, IfName: "eth0", Stdin: good}, types.ErrInvalidEnvironmentVariables, "CNI_NETNS"},
		{"netns missing", harness.Invocation{Command: "ADD", ContainerID: "c1", Netns: "/run/netns/does-not-exist-" + harness.RandomSuffix(6), IfName: "eth0", Stdin: good}, types.ErrInvalidEnvironmentVariables, "CNI_NETNS"},
		{"check without netns", harness.Invocation{Command: "CHECK", ContainerID: "c1", IfName: "eth0", Stdin: pluginConf(n.RunDir, map[string]any{"prevResult": map[string]any{"cniVersion": "1.1.0"}}), Omit: []string{"CNI_NETNS"}}, types.ErrInvalidEnvironmentVariables, "CNI_NETNS"},
		{"unknown verb", harness.Invocation{Command: "FROB", ContainerID: "c1", IfName: "eth0", Stdin: good}, types.ErrInvalidEnvironmentVariables, "CNI_COMMAND"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, cniErr, _, err := harness.ExecPlugin(c.inv)
			if err != nil {
				t.Fatal(err)
			}
			if cniErr == nil || cniErr.Code != c.code || !strings.Contains(cniErr.Msg+cniErr.Details, c.msg) {
				t.Fatalf("got %+v, want code %d mentioning %q", cniErr, c.code, c.msg)
			}
		})
	}
	// Nothing was half-configured by any of them.
	if err := n.Leaks(0); err != nil {
		t.Fatal(err)
	}
}

func TestVersion(t *testing.T) {
	privileged.Require(t)
	out, cniErr, _, err := harness.ExecPlugin(harness.Invocation{Command: "VERSION", Stdin: []byte(`{"cniVersion":"1.1.0"}`)})
	if err != nil || cniErr != nil {
		t.Fatal(err, cniErr)
	}
	var v struct {
		Supported []string `json:"supportedVersions"`
	}
	json.Unmarshal(out, &v)
	for _, want := range []string{"0.4.0", "1.0.0", "1.1.0"} {
		if !strings.Contains(strings.Join(v.Supported, ","), want) {
			t.Fatalf("VERSION %s lacks %s", out, want)
		}
	}
}

func TestExhaustionAndStatus(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.82.0.0/30"}}) // two addresses
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	if err := c.Status(ctx(t)); err != nil {
		t.Fatalf("STATUS with free addresses: %v", err)
	}
	_, rt1, _ := addPod(t, c, "a")
	addPod(t, c, "b")
	p := newPod(t, "c")
	start := time.Now()
	_, err := c.Add(ctx(t), harness.RuntimeConf(p, "eth0"))
	var e *types.Error
	if !asCNI(err, &e) || e.Code != types.ErrTryAgainLater || !strings.Contains(e.Msg, "10.82.0.0/30") || !strings.Contains(e.Msg, "blocks are full") {
		t.Fatalf("ADD on exhausted block = %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("exhaustion took %v to report", took)
	}
	// Full blocks are transient: STATUS stays ready so the runtime keeps
	// the node's network ready; only the ADD that found no address failed.
	if err := c.Status(ctx(t)); err != nil {
		t.Fatalf("STATUS while the blocks are full = %v, want ready", err)
	}
	if err := n.Leaks(2); err != nil {
		t.Fatalf("the failed ADD left state: %v", err)
	}
	if err := c.Del(ctx(t), rt1); err != nil {
		t.Fatal(err)
	}
	if err := c.Status(ctx(t)); err != nil {
		t.Fatalf("STATUS after a DEL freed an address: %v", err)
	}
	if v, err := n.Metric("coordino_cni_errors_total", `verb="ADD"`, `code="11"`); err != nil || v != 1 {
		t.Fatalf("ADD error counter = %v, %v", v, err)
	}
}

func TestDaemonUnreachable(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.83.0.0/24"}})
	c := newCNI(t, n, n.PrimaryConflist("coordino", "1.1.0"))
	p, rt, _ := addPod(t, c, "p")
	// SIGKILL leaves a stale socket file (connection refused); SIGTERM removes it (no such file).
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		if err := n.StopDaemon(sig); err != nil {
			t.Fatal(err)
		}
		q := newPod(t, "q")
		start := time.Now()
		_, err := c.Add(ctx(t), harness.RuntimeConf(q, "eth0"))
		var e *types.Error
		if !asCNI(err, &e) || e.Code != types.ErrTryAgainLater || !strings.Contains(e.Msg, filepath.Join(n.RunDir, "coordino.sock")) {
			t.Fatalf("%v: ADD with daemon down = %v", sig, err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("%v: ADD took %v to give up", sig, took)
		}
		err = c.Status(ctx(t))
		if !asCNI(err, &e) || e.Code != types.ErrPluginNotAvailable {
			t.Fatalf("%v: STATUS with daemon down = %v", sig, err)
		}
		if err := n.StartDaemon(); err != nil {
			t.Fatal(err)
		}
	}
	// The pod made before is untouched by all this.
	if err := c.Check(ctx(t), rt); err != nil {
		t.Fatalf("CHECK after restarts: %v", err)
	}
	_ = p
}

func asCNI(err error, target **types.Error) bool {
	if err == nil {
		return false
	}
	e, ok := err.(*types.Error)
	if !ok {
		// libcni wraps plugin errors; find the CNI error in the chain.
		for u := err; u != nil; {
			if ce, ok := u.(*types.Error); ok {
				*target = ce
				return true
			}
			uw, ok := u.(interface{ Unwrap() error })
			if !ok {
				return false
			}
			u = uw.Unwrap()
		}
		return false
	}
	*target = e
	return true
}
