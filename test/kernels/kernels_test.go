package kernels

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestNewestRelease(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{"6.1.0-9-amd64", "6.1.0-57-amd64"},
		{"6.12.9+deb12-amd64", "6.12.118+deb12-amd64"},
		{"6.1.0-57-amd64", "6.12.1+deb12-amd64"},
	} {
		if compareVersions(c.a, c.b) >= 0 || compareVersions(c.b, c.a) <= 0 {
			t.Errorf("%s should sort before %s", c.a, c.b)
		}
	}
	for name, pkgs := range map[string][]string{
		"6.1":  {"linux-image-6.1.0-57-amd64"},
		"6.12": {"linux-image-6.12.118+deb12-amd64"},
	} {
		for _, p := range pkgs {
			if !series[name].MatchString(p) {
				t.Errorf("series %s does not match %s", name, p)
			}
		}
	}
	for _, p := range []string{"linux-image-6.1.0-57-cloud-amd64", "linux-image-6.1.0-57-rt-amd64",
		"linux-image-6.12.118+deb12-rt-amd64", "linux-image-6.1.0-57-amd64-dbg", "linux-image-6.12.118+deb12-cloud-amd64"} {
		for name, re := range series {
			if re.MatchString(p) {
				t.Errorf("series %s matches %s: not the generic flavour", name, p)
			}
		}
	}
}

// A module comes after everything it depends on, once; built-in names are
// left out; an unknown name is an error naming it.
func TestModuleOrder(t *testing.T) {
	k := &Kernel{Release: "9.9.9", Root: t.TempDir()}
	dir := k.modulesDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dep := `kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz
kernel/net/9p/9pnet.ko.xz:
kernel/fs/netfs/netfs.ko.xz:
kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/drivers/virtio/virtio_ring.ko.xz
kernel/drivers/virtio/virtio_ring.ko.xz:
kernel/fs/overlayfs/overlay.ko.xz:
`
	os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644)
	os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/drivers/virtio/virtio_pci.ko\n"), 0o644)
	got, err := k.moduleOrder(initModules)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range got {
		names = append(names, moduleName(p))
	}
	want := []string{"9pnet", "virtio_ring", "9pnet_virtio", "netfs", "9p", "overlay"}
	if !slices.Equal(names, want) {
		t.Errorf("order %v, want %v", names, want)
	}
	if _, err := k.moduleOrder([]string{"nosuch"}); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("unknown module: %v, want an error naming it", err)
	}
}

// extractELF refuses what is not a bzImage instead of guessing.
func TestExtractELFRefusesNonBzImage(t *testing.T) {
	if _, err := extractELF(make([]byte, 4096)); err == nil || !strings.Contains(err.Error(), "HdrS") {
		t.Errorf("zeros: %v, want an error about the setup header", err)
	}
}

// Collect counts each test's result from a suite's output, and counts a
// suite that did not finish, or failed without a failed test, as a failure.
func TestCollect(t *testing.T) {
	plan := &Plan{Results: t.TempDir()}
	s := PlanSuite{Name: "x"}
	out := `=== RUN   TestA
--- PASS: TestA (0.10s)
=== RUN   TestB
=== RUN   TestB/one
    b_test.go:9: boom
--- FAIL: TestB/one (0.00s)
--- FAIL: TestB (0.00s)
=== RUN   TestC
    c_test.go:3: kernel has no SCTP
--- SKIP: TestC (0.00s)
FAIL
`
	os.WriteFile(plan.outFile(s), []byte(out), 0o644)
	r := Collect(plan, s)
	if p, f, sk := r.Counts(); p != 1 || f != 3 || sk != 1 {
		t.Errorf("counts %d/%d/%d, want 1/3/1 (the unfinished suite is a failure)", p, f, sk)
	}
	if !strings.Contains(r.Problem, "did not finish") {
		t.Errorf("problem %q, want did not finish", r.Problem)
	}
	for _, res := range r.Tests {
		if res.Test == "TestB/one" && !slices.ContainsFunc(res.Output, func(l string) bool { return strings.Contains(l, "boom") }) {
			t.Errorf("TestB/one output %q lacks its error", res.Output)
		}
	}
	os.WriteFile(plan.doneFile(s), []byte("1 100\n"), 0o644)
	if r := Collect(plan, s); r.Problem != "" {
		t.Errorf("finished with failures: problem %q, want none", r.Problem)
	}
	os.WriteFile(plan.outFile(s), []byte("=== RUN   TestA\n--- PASS: TestA (0.10s)\npanic: after the tests\n"), 0o644)
	if r := Collect(plan, s); !strings.Contains(r.Problem, "exit status 1") {
		t.Errorf("exit 1 with no failed test: problem %q", r.Problem)
	}
}

// ForKernel keeps a suite limited to some kernels off the others, and the
// order of the rest.
func TestForKernel(t *testing.T) {
	ps := []PlanSuite{{Name: "a"}, {Name: "b", Kernels: []string{"6.12"}}, {Name: "c", Kernels: []string{Host, "6.1"}}}
	for kernel, want := range map[string]string{"6.1": "a c", "6.12": "a b", Host: "a c", "6.6": "a"} {
		var got []string
		for _, s := range ForKernel(ps, kernel) {
			got = append(got, s.Name)
		}
		if strings.Join(got, " ") != want {
			t.Errorf("%s: %v, want %s", kernel, got, want)
		}
	}
}

// A guest that stopped mid-suite shows the end of its console, without
// the terminal's escape sequences, since CI keeps nothing else of it.
func TestConsoleTailPrinted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	os.WriteFile(path, []byte("\x1b[2J\x1b[0mSeaBIOS\r\nline 1\r\n[ 70.1] BUG: kernel NULL pointer dereference\r\n[ 70.2] Kernel panic - not syncing: Fatal exception\r\n"), 0o644)
	tail := consoleTail(path, 2)
	if len(tail) != 2 || !strings.HasPrefix(tail[0], "[ 70.1] BUG") || strings.Contains(strings.Join(tail, ""), "\r") {
		t.Fatalf("tail %q, want the last two lines without CR", tail)
	}
	if got := consoleTail(path, 10); strings.Contains(got[0], "\x1b") {
		t.Errorf("escape sequences kept: %q", got[0])
	}
	var b strings.Builder
	PrintKernel(&b, KernelResult{Kernel: "6.12", Console: tail, Suites: []SuiteResult{{Suite: "x", Problem: problemUnfinished}}})
	if !strings.Contains(b.String(), "> [ 70.2] Kernel panic") {
		t.Errorf("report lacks the console:\n%s", b.String())
	}
}

// A guest booted again runs the suite that did not finish and those after
// it, not the ones that did.
func TestUnfinished(t *testing.T) {
	plan := &Plan{Results: t.TempDir(), Suites: []PlanSuite{{Name: "a"}, {Name: "b"}, {Name: "c"}}}
	os.WriteFile(plan.doneFile(plan.Suites[0]), []byte("0 1\n"), 0o644)
	os.WriteFile(plan.outFile(plan.Suites[1]), []byte("=== RUN   TestX\n"), 0o644)
	var names []string
	for _, s := range unfinished(plan) {
		names = append(names, s.Name)
	}
	if strings.Join(names, " ") != "b c" {
		t.Errorf("unfinished %v, want [b c]", names)
	}
}
