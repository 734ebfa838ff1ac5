package e2e

import (
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/test/harness"
)

// TestAddRefusesDaemonNetns: CNI_NETNS naming the node's own namespace (where
// the daemon runs) is refused with code 4 before anything is created; before,
// the daemon tried to put a pod interface, address and default route there.
func TestAddRefusesDaemonNetns(t *testing.T) {
	n := newNode(t, harness.NodeOptions{PodCIDRs: []string{"10.86.0.0/24"}})
	for _, prev := range []map[string]any{nil, {"cniVersion": "1.1.0", "interfaces": []any{map[string]any{"name": "eth0", "sandbox": n.NS.Path()}},
		"ips": []any{map[string]any{"address": "10.86.1.2/24", "interface": 0}}}} {
		extra := map[string]any{}
		if prev != nil {
			extra["prevResult"] = prev
		}
		_, cniErr, _, err := harness.ExecPlugin(harness.Invocation{Command: "ADD", ContainerID: "own-netns", Netns: n.NS.Path(),
			IfName: "eth0", Stdin: pluginConf(n.RunDir, extra)})
		if err != nil {
			t.Fatal(err)
		}
		if cniErr == nil || cniErr.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(cniErr.Msg, "CNI_NETNS") ||
			!strings.Contains(cniErr.Msg, "own network namespace") {
			t.Fatalf("ADD into the daemon's netns (chained: %v) = %+v, want code 4 naming CNI_NETNS", prev != nil, cniErr)
		}
	}
	if err := n.Leaks(0); err != nil {
		t.Fatal(err)
	}
	if linkExists(n.NS, "eth0") {
		t.Fatal("an eth0 was created in the node's namespace")
	}
}
