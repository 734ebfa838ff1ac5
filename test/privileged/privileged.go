// Package privileged gates tests that need root (network namespaces, netlink,
// BPF, mounts). Outside CI they skip when not root; under CI=true they fail, so
// a green CI always means the privileged tests really ran.
package privileged

import (
	"os"
	"testing"
)

// Require skips t when not running as root, or fails it when CI=true.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("test %s needs root and CI=true: refusing to skip", t.Name())
	}
	t.Skipf("test %s needs root", t.Name())
}

// Needs is for a test that cannot run without something outside the module
// (a Debian package, a binary the test bed builds): it skips t with the
// reason, or fails it when CI=true, where hack/deps.sh and the make targets
// provide everything.
func Needs(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format+" (CI=true makes this fail)", args...)
}
