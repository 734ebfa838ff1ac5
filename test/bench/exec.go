package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/coordino/coordino/plugin"
	cniv1 "github.com/coordino/coordino/proto/cni/v1"
	"github.com/coordino/coordino/proto/cni/v1/wire"
	"github.com/coordino/coordino/test/harness"
	"github.com/coordino/coordino/test/stats"
)

// buildEmpty builds emptybin with the plugin's build flags into dir.
func buildEmpty(dir string) (string, error) { return buildCommand(dir, "emptybin") }

// buildCommand builds the command test/bench/name with the plugin's build
// flags into dir.
func buildCommand(dir, name string) (string, error) {
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./test/bench/"+name)
	cmd.Dir = harness.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v: %s", name, err, msg)
	}
	return out, nil
}

// execEmpty runs the empty binary n times and adds the CPU its processes
// used to the run's tally. It runs alone, so every child reaped meanwhile is one of them.
func (b *bed) execEmpty(n int) error {
	if b.empty == "" {
		return nil
	}
	before := readCPU(0).children
	for i := 0; i < n; i++ {
		if err := exec.Command(b.empty).Run(); err != nil {
			return fmt.Errorf("exec emptybin: %w", err)
		}
	}
	b.mu.Lock()
	b.emptyCPU += readCPU(0).children - before
	b.emptyN += n
	b.mu.Unlock()
	return nil
}

// stubResult is an ADD result as coordino-daemon writes it.
var stubResult = []byte(`{"cniVersion":"1.1.0","interfaces":[{"name":"cdo0123456789ab","mac":"aa:bb:cc:dd:ee:ff"},{"name":"eth0","mac":"aa:bb:cc:dd:ee:01","mtu":1500,"sandbox":"/var/run/netns/x"}],"ips":[{"interface":1,"address":"10.1.0.5/32","gateway":"169.254.1.1"}],"routes":[{"dst":"0.0.0.0/0","gw":"169.254.1.1"}],"dns":{}}`)

type stubCNI struct{ cniv1.UnimplementedCNIServer }

func (stubCNI) Add(context.Context, *cniv1.CNIRequest) (*cniv1.CNIResponse, error) {
	return &cniv1.CNIResponse{Result: stubResult}, nil
}

// ExecCost is the CPU of one process, median over execs that alternate
// between the plugin (ADD against a stub daemon answering at once) and the
// empty binary, read per child from wait4: the plugin process alone, with
// neither daemon work nor libcni in it. Page faults too: on a guest where
// a first page touch is dear they are most of the difference.
type ExecCost struct {
	N               int     `json:"n"`
	PluginAddCPU    float64 `json:"plugin_add_cpu_ms"`
	EmptyCPU        float64 `json:"empty_cpu_ms"`
	PluginAddFaults float64 `json:"plugin_add_minor_faults"`
	EmptyFaults     float64 `json:"empty_minor_faults"`
}

// measureExecCost runs n alternating pairs in dir.
func measureExecCost(dir, empty string, n int) (*ExecCost, error) {
	run := filepath.Join(dir, "stub-run")
	if err := os.Mkdir(run, 0o700); err != nil {
		return nil, err
	}
	sock := filepath.Join(run, wire.SocketName)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	g := grpc.NewServer()
	cniv1.RegisterCNIServer(g, stubCNI{})
	go g.Serve(l)
	defer g.Stop()
	pod, err := harness.NewPod("exec-cost")
	if err != nil {
		return nil, err
	}
	defer pod.Close()

	stdin := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"coordino","type":"coordino","runDir":%q}`, run)
	env := []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c" + harness.RandomSuffix(31), "CNI_NETNS=" + pod.NS.Path(),
		"CNI_IFNAME=eth0", "CNI_PATH=" + harness.BinDir(), plugin.RunDirRootsEnv + "=" + os.Getenv(plugin.RunDirRootsEnv)}
	var pluginCPU, emptyCPU, pluginFaults, emptyFaults []float64
	for i := 0; i < n; i++ {
		for _, bin := range []string{filepath.Join(harness.BinDir(), "coordino"), empty} {
			cmd := exec.Command(bin)
			cmd.Env = env
			cmd.Stdin = strings.NewReader(stdin)
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("exec %s: %v: %s", bin, err, out)
			}
			ru, _ := cmd.ProcessState.SysUsage().(*syscall.Rusage)
			if ru == nil {
				return nil, fmt.Errorf("no rusage for %s", bin)
			}
			ms := float64(rusageTime(*ru)) / float64(time.Millisecond)
			if bin == empty {
				emptyCPU, emptyFaults = append(emptyCPU, ms), append(emptyFaults, float64(ru.Minflt))
			} else {
				pluginCPU, pluginFaults = append(pluginCPU, ms), append(pluginFaults, float64(ru.Minflt))
			}
		}
	}
	return &ExecCost{N: n, PluginAddCPU: stats.Median(pluginCPU), EmptyCPU: stats.Median(emptyCPU),
		PluginAddFaults: stats.Median(pluginFaults), EmptyFaults: stats.Median(emptyFaults)}, nil
}
