package testbed

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	cdonetns "github.com/coordino/coordino/daemon/netns"
	"github.com/coordino/coordino/test/privileged"
)

// TestExplainNetns: each kind of netns file the runtime e2e can find left
// in containerd's netns directory is told apart, with real namespaces,
// mounts and pins: containerd's own crash windows (an empty file; a
// namespace no sandbox refers to, which no ADD reached) against a sandbox
// containerd still has, a namespace Coordino pins, and one a CNI ADD left
// interfaces in.
func TestExplainNetns(t *testing.T) {
	privileged.Require(t)
	dir, pinDir := filepath.Join(t.TempDir(), "netns"), filepath.Join(t.TempDir(), "pins")
	// mounted bind-mounts a fresh namespace on dir/name, as containerd does.
	mounted := func(name string) (string, *netlink.Handle) {
		ns, h := privileged.NewNetns(t)
		p := filepath.Join(dir, name)
		if err := cdonetns.Pin(fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(ns)), p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cdonetns.Unpin(p) })
		return p, h
	}
	empty := filepath.Join(dir, "cni-empty")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	orphan, _ := mounted("cni-orphan")
	known, _ := mounted("cni-known")
	pinned, _ := mounted("cni-pinned")
	pin := filepath.Join(pinDir, "cdo1234")
	if err := cdonetns.Pin(pinned, pin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cdonetns.Unpin(pin) })
	added, h := mounted("cni-added")
	// What an ADD leaves: a veth (both ends here, the host's end would be
	// in the host).
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "cdo-peer"}); err != nil {
		t.Fatal(err)
	}

	sandboxes := map[string]string{known: "0123abcd (NOTREADY)"}
	got := ExplainNetns([]string{empty, orphan, known, pinned, added}, sandboxes, pinDir)
	want := []struct {
		orphan bool
		says   string
	}{
		{true, "containerd's own leak: an empty file, never mounted"},
		{true, "containerd's own leak: no sandbox containerd knows refers to it"},
		{false, "containerd still has sandbox 0123abcd (NOTREADY)"},
		{false, "Coordino's leak: its pin " + pin},
		{false, "are still in it (a CNI ADD reached it"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d explanations, want %d: %v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].ContainerdOrphan() != w.orphan || !strings.Contains(got[i].String(), w.says) {
			t.Errorf("%s: orphan %v, %q; want orphan %v and it to say %q",
				filepath.Base(got[i].Path), got[i].ContainerdOrphan(), got[i], w.orphan, w.says)
		}
	}
	if !slices.Contains(got[4].Links, "eth0") || got[3].Pin != pin || !got[1].Mounted || got[0].Mounted {
		t.Errorf("details: %+v", got)
	}
}
