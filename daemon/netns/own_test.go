package netns

import (
	"errors"
	"runtime"
	"testing"

	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/coordino/coordino/test/privileged"
)

func TestRefuseOwn(t *testing.T) {
	if err := RefuseOwn("/proc/self/ns/net"); !errors.Is(err, ErrOwnNetNS) {
		t.Fatalf("own netns: %v", err)
	}
	// The same namespace through another path (the main thread's) is still ours.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := RefuseOwn("/proc/thread-self/ns/net"); !errors.Is(err, ErrOwnNetNS) {
		t.Fatalf("own netns by thread path: %v", err)
	}
	privileged.Require(t)
	other, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { other.Close(); _ = testutils.UnmountNS(other) }()
	if err := RefuseOwn(other.Path()); err != nil {
		t.Fatalf("another netns refused: %v", err)
	}
}
