package harness

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
)

// WithPodLabels returns conflist with the standalone pod-label convention
// ("args": {"cni": {"labels": [...]}}) set on every Coordino plugin entry.
// Labels live in the network config, so a runtime that wants per-pod labels
// hands each pod its own copy of the conflist.
func WithPodLabels(conflist []byte, labels map[string]string) ([]byte, error) {
	var list map[string]any
	if err := json.Unmarshal(conflist, &list); err != nil {
		return nil, fmt.Errorf("parse conflist: %w", err)
	}
	plugins, _ := list["plugins"].([]any)
	type kv struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	var ls []kv
	for k, v := range labels {
		ls = append(ls, kv{k, v})
	}
	found := false
	for _, p := range plugins {
		m, _ := p.(map[string]any)
		if m == nil || m["type"] != "coordino" {
			continue
		}
		m["args"] = map[string]any{"cni": map[string]any{"labels": ls}}
		found = true
	}
	if !found {
		return nil, fmt.Errorf("conflist has no coordino plugin")
	}
	return json.Marshal(list)
}

// RuntimeConfIn is RuntimeConf for a pod in the given Kubernetes namespace.
func RuntimeConfIn(pod *Pod, ifname, namespace string) *libcni.RuntimeConf {
	rt := RuntimeConf(pod, ifname)
	for i, a := range rt.Args {
		if a[0] == "K8S_POD_NAMESPACE" {
			rt.Args[i][1] = namespace
		}
	}
	return rt
}

// LogCount counts daemon log lines containing s.
func (n *Node) LogCount(s string) int {
	f, err := os.Open(n.logPath)
	if err != nil {
		return 0
	}
	defer f.Close()
	count := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			count++
		}
	}
	return count
}

// policyLoaded is the log message the standalone policy source writes after
// each snapshot has been handed to the datapath.
const policyLoaded = `"policy loaded"`

// WritePolicy replaces file name in the daemon's policy dir with data (or
// removes it when data is nil) and waits until the daemon has loaded the
// directory again, so the maps reflect the new content when it returns.
// The file is written elsewhere and renamed in: the watcher sees one
// complete file, never a partial one.
func (n *Node) WritePolicy(policyDir, name string, data []byte, timeout time.Duration) error {
	before := n.LogCount(policyLoaded)
	target := filepath.Join(policyDir, name)
	if data == nil {
		if err := os.Remove(target); err != nil {
			return err
		}
	} else {
		tmp := filepath.Join(n.Dir, ".policy-"+RandomSuffix(8))
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, target); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(timeout)
	for n.LogCount(policyLoaded) <= before {
		if time.Now().After(deadline) {
			return fmt.Errorf("daemon did not reload %s within %v; log:\n%s", target, timeout, n.LogTail(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
