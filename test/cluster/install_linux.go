package cluster

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coordino/coordino/test/testbed"
)

//go:embed coredns.yaml
var coreDNSManifest string

// Install applies Coordino's overlay with kubectl, one IPPool per worker
// and CoreDNS, then waits until every node is Ready and the DaemonSet, the
// controller and CoreDNS are available. Up calls it unless SkipInstall.
func (c *Cluster) Install(ctx context.Context) error {
	kdir, err := c.kustomization()
	if err != nil {
		return err
	}
	if out, err := c.Kubectl(ctx, "apply", "-k", kdir); err != nil {
		return err
	} else {
		c.Logf("cluster: %s", strings.TrimSpace(out))
	}
	// The CRDs must be served before their objects can be created.
	if _, err := c.Kubectl(ctx, "wait", "--for=condition=Established", "--timeout=60s", "crd/ippools.coordino.io"); err != nil {
		return err
	}
	if err := c.applyString(ctx, c.ipPools()); err != nil {
		return err
	}
	if c.Routing == "bgp" {
		if err := c.applyBGPPolicies(ctx); err != nil {
			return err
		}
	}
	dns, err := render(coreDNSManifest, map[string]any{"Image": CoreDNSImage, "IP": DNSServiceIP, "Domain": ClusterDNS})
	if err != nil {
		return err
	}
	if err := c.applyString(ctx, dns); err != nil {
		return err
	}
	if err := c.WaitNodesReady(ctx, 5*time.Minute); err != nil {
		// A node stays NotReady while Coordino's daemon is not serving;
		// why it is not is in its pods' status, not in the node's.
		// (Asked even when ctx ended the wait.)
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		pods, lerr := c.Client.CoreV1().Pods("coordino-system").List(lctx, metav1.ListOptions{LabelSelector: daemonSetSelector})
		if lerr != nil {
			return fmt.Errorf("%w (listing the coordino DaemonSet's pods: %v)", err, lerr)
		}
		return fmt.Errorf("%w; coordino DaemonSet pods: %s", err, podProblems(pods.Items))
	}
	for _, r := range []string{"coordino-system/daemonset/coordino", "coordino-system/deployment/coordino-controller", "kube-system/deployment/coredns"} {
		ns, obj, _ := strings.Cut(r, "/")
		if _, err := c.Kubectl(ctx, "-n", ns, "rollout", "status", "--timeout=5m", obj); err != nil {
			return err
		}
	}
	if c.Routing == "bgp" {
		if err := c.WaitRouterBlocks(ctx); err != nil {
			return err
		}
	}
	if c.Datapath == "" {
		return nil // the manifest's default; an older image may lack the metric
	}
	got, err := CheckDatapath(ctx, c.Client, c.Datapath)
	if err != nil {
		return err
	}
	c.Logf("cluster: datapaths %v", got)
	return nil
}

// daemonSetSelector selects the pods of install/kubernetes/base's DaemonSet.
const daemonSetSelector = "app.kubernetes.io/name=coordino,app.kubernetes.io/component=node"

// podProblems says, per pod, why it is not running: its phase, the
// conditions that are false, and every init or regular container that is
// waiting or has terminated with its reason and message (such as
// CreateContainerError and the runtime's words).
func podProblems(pods []corev1.Pod) string {
	if len(pods) == 0 {
		return "none (is the DaemonSet scheduled?)"
	}
	var out []string
	for _, p := range pods {
		var why []string
		for _, cond := range p.Status.Conditions {
			if cond.Status == corev1.ConditionFalse && cond.Reason != "" {
				why = append(why, fmt.Sprintf("%s=False %s %s", cond.Type, cond.Reason, cond.Message))
			}
		}
		statuses := append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
		for _, cs := range statuses {
			switch st := cs.State; {
			case st.Waiting != nil && st.Waiting.Reason != "":
				why = append(why, fmt.Sprintf("container %s waiting: %s: %s", cs.Name, st.Waiting.Reason, st.Waiting.Message))
			case st.Terminated != nil && st.Terminated.ExitCode != 0:
				why = append(why, fmt.Sprintf("container %s terminated: %s (exit %d): %s", cs.Name, st.Terminated.Reason, st.Terminated.ExitCode, st.Terminated.Message))
			}
			if lt := cs.LastTerminationState.Terminated; lt != nil && lt.ExitCode != 0 {
				why = append(why, fmt.Sprintf("container %s last exit: %s (exit %d, %d restarts): %s", cs.Name, lt.Reason, lt.ExitCode, cs.RestartCount, lt.Message))
			}
		}
		if len(why) == 0 {
			why = append(why, "no reason reported")
		}
		out = append(out, fmt.Sprintf("%s on %s (%s): %s", p.Name, p.Spec.NodeName, p.Status.Phase, strings.Join(why, "; ")))
	}
	return strings.Join(out, " | ")
}

// ipPools is one IPPool per worker (a /24 each, selected by hostname), so
// the control plane's routes to pods are static.
func (c *Cluster) ipPools() string {
	var b strings.Builder
	for i, n := range c.Nodes {
		fmt.Fprintf(&b, `---
apiVersion: coordino.io/v1alpha1
kind: IPPool
metadata:
  name: %s
spec:
  cidrs: [%q]
  blockSizeIPv4: 26
  nodeSelector:
    kubernetes.io/hostname: %s
`, n, workerPodCIDR(i+1), n)
	}
	return b.String()
}

// applyString applies manifests with kubectl.
func (c *Cluster) applyString(ctx context.Context, manifests string) error {
	f, err := os.CreateTemp(c.Dir, "apply-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(manifests); err != nil {
		f.Close()
		return err
	}
	f.Close()
	_, err = c.Kubectl(ctx, "apply", "-f", f.Name())
	return err
}

// WaitNodesReady waits until every worker reports Ready.
func (c *Cluster) WaitNodesReady(ctx context.Context, timeout time.Duration) error {
	return testbed.WaitFor(ctx, "nodes Ready", timeout, func() error {
		for _, n := range c.Nodes {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ready := false
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady {
					ready = cond.Status == corev1.ConditionTrue
					if !ready {
						return fmt.Errorf("%s not Ready: %s", n, cond.Message)
					}
				}
			}
			if !ready {
				return fmt.Errorf("%s has no Ready condition", n)
			}
		}
		return nil
	})
}

// UninstallKit is the documented uninstall kustomization (docs/install.md).
const UninstallKit = "install/kubernetes/uninstall"

// Uninstall removes Coordino the way docs/install.md tells users to: delete
// the install overlay, apply the uninstall kit and wait for its rollout
// (every node cleaned), then delete the kit.
func (c *Cluster) Uninstall(ctx context.Context) error {
	kit := filepath.Join(c.RepoRoot, UninstallKit)
	if _, err := c.Kubectl(ctx, "delete", "-k", c.Overlay, "--timeout=3m"); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "apply", "-k", kit); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "-n", "coordino-uninstall", "rollout", "status", "--timeout=5m", "daemonset/coordino-uninstall"); err != nil {
		return err
	}
	_, err := c.Kubectl(ctx, "delete", "-k", kit, "--timeout=3m")
	return err
}
