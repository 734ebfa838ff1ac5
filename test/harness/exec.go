package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/coordino/coordino/plugin"
)

// Invocation is a raw plugin call, for the error paths libcni would catch
// before the plugin runs.
type Invocation struct {
	Command, ContainerID, Netns, IfName, Args string
	Stdin                                     []byte
	// Omit lists CNI_* variables to leave out entirely.
	Omit []string
}

// ExecPlugin runs bin/coordino as a runtime would and returns its stdout,
// the CNI error it printed (nil on success) and how long it took.
func ExecPlugin(inv Invocation) ([]byte, *types.Error, time.Duration, error) {
	env := map[string]string{
		"CNI_COMMAND": inv.Command, "CNI_CONTAINERID": inv.ContainerID, "CNI_NETNS": inv.Netns,
		"CNI_IFNAME": inv.IfName, "CNI_ARGS": inv.Args, "CNI_PATH": BinDir(),
	}
	for _, k := range inv.Omit {
		delete(env, k)
	}
	cmd := exec.Command(filepath.Join(BinDir(), "coordino"))
	cmd.Env = append(os.Environ()[:0:0], "PATH="+os.Getenv("PATH"), plugin.RunDirRootsEnv+"="+os.Getenv(plugin.RunDirRootsEnv))
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = bytes.NewReader(inv.Stdin)
	var out bytes.Buffer
	cmd.Stdout = &out
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	if err == nil {
		return out.Bytes(), nil, took, nil
	}
	if _, ok := err.(*exec.ExitError); !ok {
		return nil, nil, took, err
	}
	var e types.Error
	if jerr := json.Unmarshal(out.Bytes(), &e); jerr != nil {
		return out.Bytes(), nil, took, fmt.Errorf("plugin failed without a CNI error on stdout (%v): %q", err, out.String())
	}
	return out.Bytes(), &e, took, nil
}
