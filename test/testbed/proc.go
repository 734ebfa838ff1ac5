package testbed

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is a long-running process the bed started. Its pid file records the
// PID, the kernel start time and the executable, so a later Teardown can tell
// "our process" from an unrelated one that reused the PID.
type Proc struct {
	Name    string
	Path    string
	Args    []string
	Env     []string
	LogPath string

	pidFile string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// Start launches the process with stdout and stderr appended to its log file.
func (p *Proc) Start(pidDir string) error {
	if err := os.MkdirAll(pidDir, 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logf, "\n==== %s start %s: %s %s\n", p.Name, time.Now().Format(time.RFC3339Nano), p.Path, strings.Join(p.Args, " "))
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: a terminal ^C to `go test` must not reach the
	// components before the test's cleanup stops them in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	p.pidFile = filepath.Join(pidDir, p.Name+".pid")
	st, _ := startTime(cmd.Process.Pid)
	rec := fmt.Sprintf("%d %d %s\n", cmd.Process.Pid, st, p.Path)
	if err := os.WriteFile(p.pidFile, []byte(rec), 0o644); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return nil
}

// Pid returns the process id, or 0 when not started.
func (p *Proc) Pid() int {
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the process has not exited yet.
func (p *Proc) Running() bool {
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM, waits up to grace, then SIGKILLs. Safe to call twice.
func (p *Proc) Stop(grace time.Duration) error {
	return p.signalAndWait(syscall.SIGTERM, grace)
}

// Kill simulates a crash: SIGKILL, no chance to clean up.
func (p *Proc) Kill() error {
	return p.signalAndWait(syscall.SIGKILL, 5*time.Second)
}

func (p *Proc) signalAndWait(sig syscall.Signal, grace time.Duration) error {
	if p.cmd == nil {
		return nil
	}
	if p.Running() {
		_ = p.cmd.Process.Signal(sig)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	_ = os.Remove(p.pidFile)
	return nil
}

// startTime is field 22 of /proc/PID/stat (clock ticks since boot); with the
// PID it identifies a process uniquely.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces and parens: parse after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, errors.New("short stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// recorded reads a pid file (PID, start time, executable) and reports
// whether that process is still the one running under its PID.
func recorded(pidFile string) (pid int, alive bool, err error) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, false, err
	}
	var st uint64
	var exe string
	if _, err := fmt.Sscanf(string(b), "%d %d %s", &pid, &st, &exe); err != nil {
		return 0, false, fmt.Errorf("%s: %w", pidFile, err)
	}
	cur, err := startTime(pid)
	return pid, err == nil && cur == st, nil
}

// RecordedAlive reports whether the process a pid file describes still runs
// (PID and start time match).
func RecordedAlive(pidFile string) bool {
	_, alive, err := recorded(pidFile)
	return err == nil && alive
}

// killRecorded kills the process described by a pid file when it is still the
// same process (PID and start time match), then removes the file.
func killRecorded(pidFile string) error {
	pid, alive, err := recorded(pidFile)
	if err != nil {
		return err
	}
	if alive {
		killAndWait(pid)
	}
	return os.Remove(pidFile)
}

// killAndWait SIGTERMs pid, gives it a few seconds, then SIGKILLs it. The
// process is not our child here, so waiting means polling /proc.
func killAndWait(pid int) {
	st, err := startTime(pid)
	if err != nil {
		return
	}
	alive := func() bool {
		cur, err := startTime(pid)
		if err != nil || cur != st {
			return false
		}
		s, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		i := bytes.LastIndexByte(s, ')')
		return i < 0 || len(s) < i+3 || s[i+2] != 'Z'
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !alive() {
			return
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && alive(); time.Sleep(50 * time.Millisecond) {
	}
}
