package harness

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// PreviousRelease returns the directory holding the previous release's
// coordino, coordino-daemon and coordino-controller, building them when
// they are not cached (hack/build-previous.sh). The release is
// $PREVIOUS_RELEASE, else the Makefile's default. A checkout without that
// commit (a shallow clone) skips the test with SKEW NOT TESTED, in CI too:
// not this tree's fault, and said loudly.
func PreviousRelease(t testing.TB) string {
	t.Helper()
	ref := os.Getenv("PREVIOUS_RELEASE")
	if ref == "" {
		mk, err := os.ReadFile(filepath.Join(RepoRoot(), "Makefile"))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^PREVIOUS_RELEASE \?= (\S+)$`).FindSubmatch(mk)
		if m == nil {
			t.Fatal("Makefile sets no PREVIOUS_RELEASE")
		}
		ref = string(m[1])
	}
	out, err := exec.Command(filepath.Join(RepoRoot(), "hack", "build-previous.sh"), ref).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 3 {
			t.Skipf("SKEW NOT TESTED: %s", strings.TrimSpace(string(ee.Stderr)))
		}
		if errors.As(err, &ee) {
			t.Fatalf("build previous release %s: %v\n%s", ref, err, ee.Stderr)
		}
		t.Fatalf("build previous release %s: %v", ref, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}
