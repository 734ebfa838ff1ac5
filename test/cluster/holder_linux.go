package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	cdonetns "github.com/coordino/coordino/daemon/netns"
	"github.com/coordino/coordino/test/testbed"
)

// holderEnv carries a machineSpec to a re-executed binary: the process then
// becomes the machine's holder (see runHolder) instead of running main.
const holderEnv = "COORDINO_CLUSTER_MACHINE"

// machineSpec is what a holder sets up in its fresh mount and UTS
// namespaces before it signals ready.
type machineSpec struct {
	Hostname string `json:"hostname"`
	// Binds maps a path of the machine (created on the host if missing) to
	// the per-machine directory mounted over it.
	Binds map[string]string `json:"binds"`
	// BPFFS mounts a private bpffs on /sys/fs/bpf.
	BPFFS bool `json:"bpffs"`
}

func init() {
	if spec := os.Getenv(holderEnv); spec != "" {
		if err := runHolder(spec); err != nil {
			fmt.Fprintln(os.Stderr, "machine holder:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// runHolder makes the holder's mount namespace the machine's: nothing it
// mounts reaches the host (rslave), the machine's paths are its own
// directories, shared inside the machine so pods may use Bidirectional
// propagation. It prints "ready" and then waits for SIGTERM; the machine's
// other processes join its namespaces with nsenter.
func runHolder(specJSON string) error {
	var spec machineSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / rslave: %w", err)
	}
	var shared []string
	for dst, src := range spec.Binds {
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", src, dst, err)
		}
		shared = append(shared, dst)
	}
	if spec.BPFFS {
		// A host that mounts bpffs itself (systemd does) hands the machine
		// a copy of it, now a slave; stacked under the machine's own, it
		// would still be what containerd's mount lookup finds first for
		// /sys/fs/bpf, and containerd refuses a Bidirectional mount of a
		// path whose mount is not shared.
		if err := cdonetns.Detach("/sys/fs/bpf"); err != nil {
			return fmt.Errorf("detach the inherited bpffs: %w", err)
		}
		if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mount bpffs: %w", err)
		}
		shared = append(shared, "/sys/fs/bpf")
	}
	for _, dst := range shared {
		if err := unix.Mount("", dst, "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
			return fmt.Errorf("make %s rshared: %w", dst, err)
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	fmt.Println("ready")
	<-sig
	return nil
}

// machine is one network namespace of the cluster with its holder process.
type machine struct {
	name      string
	ns        netns.NsHandle
	holderPid int
}

// startHolder starts the machine's holder inside ns, in new mount and UTS
// namespaces, and waits until its mounts are in place. Mount points missing
// on the host are created and returned so teardown can remove them.
func (c *Cluster) startHolder(m *machine, spec machineSpec) error {
	for dst, src := range spec.Binds {
		if err := os.MkdirAll(src, 0o755); err != nil {
			return err
		}
		if _, err := os.Stat(dst); os.IsNotExist(err) {
			if err := c.createMountPoint(dst); err != nil {
				return err
			}
		}
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	// The holder's "ready" line comes through a pipe; its log file gets the
	// rest.
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer pr.Close()
	logf, err := os.OpenFile(c.logPath(m.name+"-holder"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		pw.Close()
		return err
	}
	defer logf.Close()
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), holderEnv+"="+string(b))
	cmd.Stdout, cmd.Stderr = pw, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS}
	// The child inherits the network namespace of the thread that forks it.
	err = inNetns(m.ns, cmd.Start)
	pw.Close()
	if err != nil {
		return fmt.Errorf("start %s holder: %w", m.name, err)
	}
	if err := recordPid(c.path("pids", m.name+"-holder.pid"), cmd.Process.Pid, self); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	go func() { _ = cmd.Wait() }()
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(pr).ReadString('\n')
		line <- strings.TrimSpace(s)
		_, _ = io.Copy(logf, pr)
	}()
	select {
	case l := <-line:
		if l != "ready" {
			return fmt.Errorf("%s holder failed (%q), see %s", m.name, l, c.logPath(m.name+"-holder"))
		}
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s holder not ready after 30s", m.name)
	}
	m.holderPid = cmd.Process.Pid
	return nil
}

// recordPid writes a pid file in testbed.Proc's format (PID, start time,
// executable) for a process started outside testbed.Proc.
func recordPid(pidFile string, pid int, exe string) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return err
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 20 {
		return fmt.Errorf("short /proc/%d/stat", pid)
	}
	if err := os.MkdirAll(filepath.Dir(pidFile), 0o755); err != nil {
		return err
	}
	return os.WriteFile(pidFile, []byte(strconv.Itoa(pid)+" "+f[19]+" "+exe+"\n"), 0o644)
}

// startIn starts a machine's program inside its namespaces (mount, network,
// UTS) through nsenter, which execs it: the recorded PID is the program's.
func (c *Cluster) startIn(m *machine, name, bin string, args []string, env ...string) (*testbed.Proc, error) {
	full := append([]string{"--target", strconv.Itoa(m.holderPid), "--mount", "--net", "--uts", "--", bin}, args...)
	p := &testbed.Proc{Name: m.name + "-" + name, Path: c.nsenter, Args: full, Env: env, LogPath: c.logPath(m.name + "-" + name)}
	if err := p.Start(c.path("pids")); err != nil {
		return nil, err
	}
	c.procs = append(c.procs, p)
	return p, nil
}
