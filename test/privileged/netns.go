package privileged

import (
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// NewNetns returns a fresh, unnamed network namespace and a netlink handle
// in it, both closed when t ends (the namespace goes with its last user).
// It Requires root.
func NewNetns(t *testing.T) (netns.NsHandle, *netlink.Handle) {
	t.Helper()
	Require(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(); ns.Close() })
	return ns, h
}
