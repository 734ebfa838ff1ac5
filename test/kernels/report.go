package kernels

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Result is one test's outcome on one kernel.
type Result struct {
	Test    string
	Action  string // "pass", "fail" or "skip"
	Elapsed time.Duration
	Output  []string // the test's own lines, kept for failures and skips
}

// SuiteResult is a suite's outcome on one kernel.
type SuiteResult struct {
	Suite   string
	Tests   []Result
	Problem string // the suite itself failed: no output, crash, timeout
}

// Counts returns the suite's passed, failed and skipped tests (subtests
// included); a suite that failed as a whole counts one failure more.
func (r SuiteResult) Counts() (pass, fail, skip int) {
	for _, t := range r.Tests {
		switch t.Action {
		case "pass":
			pass++
		case "fail":
			fail++
		case "skip":
			skip++
		}
	}
	if r.Problem != "" {
		fail++
	}
	return
}

// event is a line of go test -json (cmd/test2json).
type event struct {
	Action  string
	Test    string
	Elapsed float64
	Output  string
}

// problemUnfinished is the problem of a suite whose guest stopped (or was
// stopped) before the suite ended.
const problemUnfinished = "did not finish (guest stopped or timed out)"

// Collect reads a suite's results back: its -test.v=test2json output
// through go tool test2json, and its exit status.
func Collect(plan *Plan, s PlanSuite) SuiteResult {
	res := SuiteResult{Suite: s.Name}
	raw, err := os.ReadFile(plan.outFile(s))
	if err != nil {
		res.Problem = "did not start (no output file)"
		return res
	}
	exit, err := os.ReadFile(plan.doneFile(s))
	if err != nil {
		res.Problem = problemUnfinished
	}
	cmd := exec.Command("go", "tool", "test2json", "-t", "-p", s.Name)
	cmd.Stdin = bytes.NewReader(raw)
	js, err := cmd.Output()
	if err != nil && len(js) == 0 {
		res.Problem = fmt.Sprintf("test2json: %v", err)
		return res
	}
	output := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(js))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.Test == "" {
			continue
		}
		switch e.Action {
		case "output":
			output[e.Test] = append(output[e.Test], strings.TrimRight(e.Output, "\n"))
		case "pass", "fail", "skip":
			res.Tests = append(res.Tests, Result{Test: e.Test, Action: e.Action,
				Elapsed: time.Duration(e.Elapsed * float64(time.Second)), Output: output[e.Test]})
		}
	}
	if res.Problem == "" {
		var code int
		if _, err := fmt.Sscan(string(exit), &code); err != nil {
			code = -1 // an unreadable status is no success
		}
		_, fail, _ := res.Counts()
		if code != 0 && fail == 0 {
			res.Problem = fmt.Sprintf("exit status %d with no failed test: %s", code, lastLines(raw, 5))
		}
	}
	if len(res.Tests) == 0 && res.Problem == "" {
		res.Problem = "ran no test: " + lastLines(raw, 5)
	}
	return res
}

// lastLines is the last n lines of b, on one line.
func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// KernelResult is every suite's outcome on one kernel.
type KernelResult struct {
	Kernel string // the column: "host", "6.1", "6.12"
	Detail string // release, and how it ran
	Suites []SuiteResult
	Note   string
	// Console is the end of a guest's console when a suite did not finish.
	Console []string
}

// PrintKernel lists each test with its result; a failure shows the end of
// its output, a skip its reason.
func PrintKernel(w io.Writer, k KernelResult) {
	fmt.Fprintf(w, "\n=== kernel %s (%s)\n", k.Kernel, k.Detail)
	if k.Note != "" {
		fmt.Fprintf(w, "    %s\n", k.Note)
	}
	for _, s := range k.Suites {
		for _, t := range s.Tests {
			fmt.Fprintf(w, "  %-4s %-10s %s (%.1fs)\n", strings.ToUpper(t.Action), s.Suite, t.Test, t.Elapsed.Seconds())
			if t.Action == "fail" || t.Action == "skip" {
				for _, l := range excerpt(t.Output, t.Action) {
					fmt.Fprintf(w, "         | %s\n", l)
				}
			}
		}
		if s.Problem != "" {
			fmt.Fprintf(w, "  FAIL %-10s (suite) %s\n", s.Suite, s.Problem)
		}
	}
	if len(k.Console) > 0 {
		fmt.Fprintf(w, "  the guest's console, last %d lines:\n", len(k.Console))
		for _, l := range k.Console {
			fmt.Fprintf(w, "    > %s\n", l)
		}
	}
}

// excerpt keeps a failure's last lines and a skip's reason, minus the
// === RUN / --- lines test2json already turned into results.
func excerpt(lines []string, action string) []string {
	var keep []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") || t == "" {
			continue
		}
		keep = append(keep, l)
	}
	if action == "skip" {
		if len(keep) > 2 {
			keep = keep[len(keep)-2:]
		}
		return keep
	}
	// A failure's first lines say what failed, its last ones why (a
	// verifier log ends with the refusal).
	if len(keep) > 12 {
		keep = append(append(keep[:3:3], "..."), keep[len(keep)-8:]...)
	}
	return keep
}

// PrintSummary prints the kernel x suite table and the closing line CI
// reads, and returns the number of failures.
func PrintSummary(w io.Writer, ks []KernelResult) int {
	suites := []string{}
	seen := map[string]bool{}
	for _, k := range ks {
		for _, s := range k.Suites {
			if !seen[s.Suite] {
				seen[s.Suite] = true
				suites = append(suites, s.Suite)
			}
		}
	}
	fmt.Fprintf(w, "\n%-8s", "kernel")
	for _, s := range suites {
		fmt.Fprintf(w, " %-16s", s)
	}
	fmt.Fprintf(w, "   (passed/failed/skipped)\n")
	var tp, tf, ts int
	for _, k := range ks {
		fmt.Fprintf(w, "%-8s", k.Kernel)
		if len(k.Suites) == 0 {
			fmt.Fprintf(w, " %s\n", k.Note)
			continue
		}
		for _, name := range suites {
			cell := "-"
			for _, s := range k.Suites {
				if s.Suite == name {
					p, f, sk := s.Counts()
					tp, tf, ts = tp+p, tf+f, ts+sk
					cell = fmt.Sprintf("%d/%d/%d", p, f, sk)
				}
			}
			fmt.Fprintf(w, " %-16s", cell)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", tp, tf, ts)
	return tf
}
