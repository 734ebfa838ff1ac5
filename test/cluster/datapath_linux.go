package cluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// checkDatapath refuses a Datapath the daemon would refuse, before a bed
// is built for nothing. "" keeps the manifest's (the daemon's default, auto).
func checkDatapath(d string) error {
	switch d {
	case "", "ebpf", "nftables", "auto":
		return nil
	}
	return fmt.Errorf("cluster: Datapath %q: want ebpf, nftables or auto (or empty for the manifest's default)", d)
}

// kustomization is the directory Install applies: the overlay itself, or,
// with Datapath or Routing set, a kustomization in the bed's directory
// that takes the overlay and appends --datapath and --routing to the
// daemon's arguments (so the daemons start on them: a patch after the
// apply would first run them on the defaults).
func (c *Cluster) kustomization() (string, error) {
	var args []string
	if c.Datapath != "" {
		args = append(args, "--datapath="+c.Datapath)
	}
	if c.Routing != "" {
		args = append(args, "--routing="+c.Routing)
	}
	if len(args) == 0 {
		return c.Overlay, nil
	}
	dir := c.path("kustomize")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// kustomize takes other kustomizations by relative path only.
	rel, err := filepath.Rel(dir, c.Overlay)
	if err != nil {
		return "", fmt.Errorf("overlay %s relative to %s: %w", c.Overlay, dir, err)
	}
	k, err := render(argsKustomization, map[string]any{"Overlay": rel, "Args": args})
	if err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}

// argsKustomization: containers/0 is the daemon in
// install/kubernetes/base (CheckDatapath proves --datapath took).
const argsKustomization = `# Written by test/cluster: the overlay with the bed's daemon flags.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {{.Overlay}}
patches:
  - target:
      group: apps
      version: v1
      kind: DaemonSet
      name: coordino
    patch: |-
{{- range .Args}}
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: {{.}}
{{- end}}
`

// DaemonMetricsPort is where the daemon serves /metrics on the node's
// address (install/kubernetes/base, --metrics-addr).
const DaemonMetricsPort = 9190

// NodeDatapath is what enforces policy on one node, from its daemon's
// coordino_datapath_info.
type NodeDatapath struct {
	Node     string
	Datapath string // ebpf, nftables or none
	Fallback bool   // --datapath=auto could not load eBPF
}

func (nd NodeDatapath) String() string {
	if nd.Fallback {
		return nd.Node + "=" + nd.Datapath + " (fallback)"
	}
	return nd.Node + "=" + nd.Datapath
}

// Datapaths asks every daemon of the DaemonSet which datapath enforces on
// its node (coordino_datapath_info on its metrics port, at the pod's host
// address), sorted by node.
func Datapaths(ctx context.Context, client kubernetes.Interface) ([]NodeDatapath, error) {
	pods, err := client.CoreV1().Pods("coordino-system").List(ctx, metav1.ListOptions{LabelSelector: daemonSetSelector})
	if err != nil {
		return nil, fmt.Errorf("listing the coordino DaemonSet's pods: %w", err)
	}
	if len(pods.Items) == 0 {
		return nil, fmt.Errorf("no coordino DaemonSet pods (selector %s)", daemonSetSelector)
	}
	hc := http.Client{Timeout: 10 * time.Second}
	var out []NodeDatapath
	for _, p := range pods.Items {
		if p.Status.HostIP == "" {
			return nil, fmt.Errorf("daemon pod %s on %s has no host address yet", p.Name, p.Spec.NodeName)
		}
		url := fmt.Sprintf("http://%s:%d/metrics", p.Status.HostIP, DaemonMetricsPort)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return nil, fmt.Errorf("metrics of daemon pod %s on %s: %w", p.Name, p.Spec.NodeName, err)
		}
		nd, err := parseDatapathInfo(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("daemon pod %s on %s (%s): %w", p.Name, p.Spec.NodeName, url, err)
		}
		nd.Node = p.Spec.NodeName
		out = append(out, nd)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

var (
	datapathLabel = regexp.MustCompile(`datapath="([^"]*)"`)
	fallbackLabel = regexp.MustCompile(`fallback="([^"]*)"`)
)

// parseDatapathInfo finds the coordino_datapath_info sample of value 1 in
// a Prometheus text exposition.
func parseDatapathInfo(r io.Reader) (NodeDatapath, error) {
	var found []NodeDatapath
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for s.Scan() {
		line := s.Text()
		if !strings.HasPrefix(line, "coordino_datapath_info{") {
			continue
		}
		labels, value, ok := strings.Cut(line[len("coordino_datapath_info"):], "} ")
		if !ok || strings.TrimSpace(value) != "1" {
			continue
		}
		dp := datapathLabel.FindStringSubmatch(labels)
		if dp == nil {
			return NodeDatapath{}, fmt.Errorf("coordino_datapath_info without a datapath label: %q", line)
		}
		fb := fallbackLabel.FindStringSubmatch(labels)
		found = append(found, NodeDatapath{Datapath: dp[1], Fallback: fb != nil && fb[1] == "true"})
	}
	if err := s.Err(); err != nil {
		return NodeDatapath{}, err
	}
	switch len(found) {
	case 0:
		return NodeDatapath{}, fmt.Errorf("no coordino_datapath_info of value 1 (a daemon without the datapath choice metric?)")
	case 1:
		return found[0], nil
	}
	return NodeDatapath{}, fmt.Errorf("%d coordino_datapath_info samples of value 1, want one", len(found))
}

// CheckDatapath fails unless every node's daemon enforces policy with want
// (and, for auto, reports what each chose): the suites must not pass on a
// datapath other than the one asked for.
func CheckDatapath(ctx context.Context, client kubernetes.Interface, want string) ([]NodeDatapath, error) {
	got, err := Datapaths(ctx, client)
	if err != nil {
		return nil, err
	}
	if want == "" || want == "auto" {
		return got, nil
	}
	var wrong []string
	for _, nd := range got {
		if nd.Datapath != want || nd.Fallback {
			wrong = append(wrong, fmt.Sprintf("%s enforces with %s (fallback %t)", nd.Node, nd.Datapath, nd.Fallback))
		}
	}
	if len(wrong) > 0 {
		return got, fmt.Errorf("want --datapath=%s on every node: %s", want, strings.Join(wrong, "; "))
	}
	return got, nil
}
