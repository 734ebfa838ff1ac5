package kernels

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options says what a matrix run covers.
type Options struct {
	Repo     string   // the repository root
	Cache    string   // DefaultCacheDir unless set
	Kernels  []string // "host" and series names
	Suites   []Suite
	Run      string // replaces every chosen suite's -test.run when set
	Slowdown int    // COORDINO_TEST_SLOWDOWN in guests
	// NoConntrack leaves nf_conntrack to be loaded on demand instead of
	// before the suites (to tell its effect apart).
	NoConntrack bool
	Live        io.Writer
	Logf        func(string, ...any)
}

// Host is the matrix's name for the kernel the harness runs on.
const Host = "host"

// Matrix builds the suites' test binaries once and runs them on every
// kernel of opts, one after the other (the guests use both CPUs).
func Matrix(ctx context.Context, opts Options) ([]KernelResult, error) {
	if opts.Cache == "" {
		opts.Cache = DefaultCacheDir
	}
	work := filepath.Join(opts.Repo, "bin", "kernels")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	runner, err := copySelf(work)
	if err != nil {
		return nil, err
	}
	var ps []PlanSuite
	built := map[string]bool{}
	for _, s := range opts.Suites {
		bin := filepath.Join(work, strings.ReplaceAll(strings.Trim(s.Package, "./"), "/", "-")+".test")
		if !built[bin] {
			opts.Logf("building %s (%s)", bin, s.Package)
			cmd := exec.Command("go", "test", "-c", "-o", bin, s.Package)
			cmd.Dir = opts.Repo
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("go test -c %s: %v: %s", s.Package, err, out)
			}
			built[bin] = true
		}
		run := s.Run
		if opts.Run != "" {
			run = opts.Run
		}
		args := []string{"-test.v=test2json", "-test.count=1", "-test.timeout=" + s.Timeout.String(), "-test.run=" + run}
		if s.Skip != "" {
			args = append(args, "-test.skip="+s.Skip)
		}
		ps = append(ps, PlanSuite{Name: s.Name, Binary: bin, Dir: filepath.Join(opts.Repo, s.Package), Args: args, Modules: s.Modules, Kernels: s.Kernels, Timeout: s.Timeout})
	}
	// Guests run side by side: much of a suite's time is waiting (probes
	// that must time out, daemons starting), which the other guest's
	// emulation fills. The host's own run goes first, alone.
	// Kernels are fetched first, one at a time (apt takes a lock).
	guests := map[string]*Kernel{}
	for _, name := range opts.Kernels {
		if name != Host {
			k, err := Prepare(opts.Cache, name, opts.Logf)
			if err != nil {
				return nil, err
			}
			guests[name] = k
		}
	}
	results := make([]KernelResult, len(opts.Kernels))
	errs := make([]error, len(opts.Kernels))
	var wg sync.WaitGroup
	for i, name := range opts.Kernels {
		if name == Host {
			results[i], errs[i] = runKernel(ctx, opts, nil, ps, work, runner)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = runKernel(ctx, opts, guests[name], ps, work, runner)
		}()
	}
	wg.Wait()
	return results, errors.Join(errs...)
}

// runKernel runs the suites on k (nil: the host) and collects the results.
func runKernel(ctx context.Context, opts Options, k *Kernel, ps []PlanSuite, work, runner string) (KernelResult, error) {
	name := Host
	if k != nil {
		name = k.Name
	}
	kr := KernelResult{Kernel: name}
	if ps = ForKernel(ps, name); len(ps) == 0 {
		kr.Note = "no suite chosen runs on this kernel"
		return kr, nil
	}
	dir := filepath.Join(work, "results", name)
	if err := os.RemoveAll(dir); err != nil {
		return kr, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return kr, err
	}
	plan := &Plan{Results: dir, Suites: ps, Env: []string{"PATH=" + os.Getenv("PATH")}}
	if !opts.NoConntrack {
		plan.Modules = conntrack
	}
	if ci := os.Getenv("CI"); ci != "" {
		plan.Env = append(plan.Env, "CI="+ci)
	}
	start := time.Now()
	if k == nil {
		kr.Detail = hostRelease() + ", natively"
		if err := runSuites(plan, os.Environ(), false); err != nil {
			kr.Note = err.Error()
		}
	} else {
		plan.Env = append(plan.Env, "COORDINO_TEST_SLOWDOWN="+strconv.Itoa(opts.Slowdown))
		kr.Detail = k.Release + ", qemu TCG"
		kr.Note, kr.Console = bootGuest(ctx, opts, k, plan, runner)
	}
	kr.Detail += fmt.Sprintf(", %s", time.Since(start).Round(time.Second))
	for _, s := range ps {
		kr.Suites = append(kr.Suites, Collect(plan, s))
	}
	return kr, nil
}

// bootGuest runs plan in a guest on k. A guest that stops in the middle of
// a suite (a panic under emulation, once in many runs) is booted once more
// from that suite on; the report says so and keeps the first console's
// end, and a second stop fails the suites left. A guest that overruns its
// time is not booted again.
func bootGuest(ctx context.Context, opts Options, k *Kernel, plan *Plan, runner string) (note string, console []string) {
	consoleLog := filepath.Join(plan.Results, "console.log")
	run := *plan
	for attempt := 1; ; attempt++ {
		timeout := 2 * time.Minute
		for _, s := range run.Suites {
			timeout += s.Timeout
		}
		opts.Logf("booting %s (console: %s)", k.Release, consoleLog)
		err := Boot(ctx, k, &run, runner, timeout, opts.Live)
		left := unfinished(&run)
		switch {
		case err != nil:
			return strings.TrimSpace(note + " " + err.Error()), consoleTail(consoleLog, 40)
		case len(left) == 0:
			return note, console
		case attempt == 2:
			return note + "; it stopped again", consoleTail(consoleLog, 40)
		}
		// The console's end says why (a panic, an oops, the OOM killer):
		// CI keeps nothing else of it.
		console = consoleTail(consoleLog, 40)
		note = fmt.Sprintf("the guest stopped during suite %s and was booted again from it (its console's end below)", left[0].Name)
		_ = os.Rename(consoleLog, filepath.Join(plan.Results, "console-1.log"))
		run.Suites = left
	}
}

// unfinished returns the suites of plan that wrote no exit status, in
// order.
func unfinished(plan *Plan) []PlanSuite {
	var left []PlanSuite
	for _, s := range plan.Suites {
		if _, err := os.Stat(plan.doneFile(s)); err != nil {
			left = append(left, s)
		}
	}
	return left
}

// consoleTail returns the last n lines of a guest's console, without the
// terminal's control sequences.
func consoleTail(path string, n int) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return []string{err.Error()}
	}
	b = ansi.ReplaceAll(b, nil)
	lines := strings.Split(strings.TrimRight(strings.ReplaceAll(string(b), "\r", ""), "\n"), "\n")
	return lines[max(0, len(lines)-n):]
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// copySelf puts the harness binary where a guest finds it: the host's /tmp
// is not the guest's.
func copySelf(dir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(self)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(dir, "kernels-guest")
	if err := writeAtomic(dst, data); err != nil {
		return "", err
	}
	return dst, os.Chmod(dst, 0o755)
}

func hostRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

// SelectSuites returns the suites whose names match re ("" for all).
func SelectSuites(re string) ([]Suite, error) {
	m, err := regexp.Compile(re)
	if err != nil {
		return nil, fmt.Errorf("SUITES %q: %w", re, err)
	}
	var out []Suite
	for _, s := range Suites {
		if m.MatchString(s.Name) {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("SUITES %q matches no suite", re)
	}
	return out, nil
}
