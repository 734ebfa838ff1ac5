package kernels

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Plan is what the host hands the guest (RESULTS/plan.json): the suites to
// run and the environment to run them in. The host-native run follows the
// same plan.
type Plan struct {
	Results string      // directory of the output files
	Env     []string    // added to every suite's environment
	Suites  []PlanSuite // in order
	Modules []string    // loaded in a guest before any suite
}

// PlanSuite is one test binary to run.
type PlanSuite struct {
	Name    string
	Binary  string   // built by go test -c
	Dir     string   // the package's directory, as go test runs it
	Args    []string // -test.* flags
	Modules []string // loaded with modprobe first
	// Kernels limits the suite to these kernels (empty: every kernel).
	Kernels []string
	Timeout time.Duration
}

// ForKernel returns the suites of ps that run on kernel (a series name or
// Host), in order.
func ForKernel(ps []PlanSuite, kernel string) []PlanSuite {
	var out []PlanSuite
	for _, s := range ps {
		if len(s.Kernels) == 0 || slices.Contains(s.Kernels, kernel) {
			out = append(out, s)
		}
	}
	return out
}

// outFile and doneFile are where a suite's -test.v=test2json output and its
// exit status go.
func (p *Plan) outFile(s PlanSuite) string  { return filepath.Join(p.Results, s.Name+".out") }
func (p *Plan) doneFile(s PlanSuite) string { return filepath.Join(p.Results, s.Name+".exit") }

// Guest is the harness as the guest's first process (after init.sh): it
// brings loopback up, runs the plan at path and powers the guest off.
func Guest(path string) {
	if err := guest(path); err != nil {
		fmt.Fprintln(os.Stderr, "coordino-guest:", err)
	}
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		fmt.Fprintln(os.Stderr, "coordino-guest: power off:", err)
	}
	os.Exit(1)
}

func guest(path string) error {
	var plan Plan
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &plan); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	var uts unix.Utsname
	_ = unix.Uname(&uts) // the release is only printed
	fmt.Printf("coordino-guest: kernel %s, %d suites\n", unix.ByteSliceToString(uts.Release[:]), len(plan.Suites))
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "TMPDIR=/tmp"}, plan.Env...)
	for _, kv := range env {
		if path, ok := strings.CutPrefix(kv, "PATH="); ok {
			_ = os.Setenv("PATH", path) // for exec.LookPath, here and in modprobe
		}
	}
	modprobe(plan.Modules)
	return runSuites(&plan, env, true)
}

// runSuites runs every suite of plan, each test binary's output in its
// .out file and its exit status in its .exit file. Only the guest
// (loadModules) loads modules: on the host they are the host's business.
func runSuites(plan *Plan, env []string, loadModules bool) error {
	for _, s := range plan.Suites {
		if loadModules {
			modprobe(s.Modules)
		}
		out, err := os.Create(plan.outFile(s))
		if err != nil {
			return err
		}
		start := time.Now()
		cmd := exec.Command(s.Binary, s.Args...)
		cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = s.Dir, env, out, out
		err = cmd.Run()
		out.Close()
		code := 0
		if err != nil {
			code = -1
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
			fmt.Printf("kernels: %s: %v\n", s.Name, err)
		}
		fmt.Printf("kernels: suite %s done in %s (exit %d)\n", s.Name, time.Since(start).Round(time.Second), code)
		if err := os.WriteFile(plan.doneFile(s), []byte(fmt.Sprintf("%d %d\n", code, time.Since(start).Milliseconds())), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// modprobe loads modules, saying which failed: a suite that needs one then
// fails or skips with its own message.
func modprobe(modules []string) {
	for _, m := range modules {
		if out, err := exec.Command("modprobe", m).CombinedOutput(); err != nil {
			fmt.Printf("coordino-guest: modprobe %s: %v: %s\n", m, err, strings.TrimSpace(string(out)))
		}
	}
}
