package cluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/coordino/coordino/test/testbed"
)

// ServerPort is where Server pods listen (agnhost netexec, HTTP and UDP).
const ServerPort = 8080

// CreateNamespace creates ns (idempotent) and waits for its default
// ServiceAccount.
func (c *Cluster) CreateNamespace(ctx context.Context, ns string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return testbed.WaitFor(ctx, ns+" default ServiceAccount", 60*time.Second, func() error {
		_, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
}

// Server starts an agnhost netexec pod on node and returns its address once
// it is Running and ready.
func (c *Cluster) Server(ctx context.Context, ns, name, node string, labels map[string]string) (string, error) {
	port := corev1.ContainerPort{ContainerPort: ServerPort}
	pod := c.agnhostPod(ns, name, node, labels, corev1.RestartPolicyAlways,
		"netexec", fmt.Sprintf("--http-port=%d", ServerPort), fmt.Sprintf("--udp-port=%d", ServerPort))
	pod.Spec.Containers[0].Ports = []corev1.ContainerPort{port}
	pod.Spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1,
		ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(ServerPort)}}}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	var ip string
	err := testbed.WaitFor(ctx, ns+"/"+name+" ready", 3*time.Minute, func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue && p.Status.PodIP != "" {
				ip = p.Status.PodIP
				return nil
			}
		}
		return fmt.Errorf("phase %s %s", p.Status.Phase, podWhy(p))
	})
	return ip, err
}

// Connect runs a one-shot agnhost client pod on node that opens a TCP
// connection to addr (host:port) and reports whether it succeeded. A
// refused or timed-out connection is (false, nil); errors are the bed's.
func (c *Cluster) Connect(ctx context.Context, ns, name, node, addr string, labels map[string]string) (bool, error) {
	pod := c.agnhostPod(ns, name, node, labels, corev1.RestartPolicyNever, "connect", addr, "--timeout=5s")
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return false, err
	}
	defer func() {
		_ = c.Client.CoreV1().Pods(ns).Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}()
	var ok bool
	err := testbed.WaitFor(ctx, ns+"/"+name+" done", 3*time.Minute, func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		switch p.Status.Phase {
		case corev1.PodSucceeded:
			ok = true
			return nil
		case corev1.PodFailed:
			return nil
		}
		return fmt.Errorf("phase %s %s", p.Status.Phase, podWhy(p))
	})
	return ok, err
}

func (c *Cluster) agnhostPod(ns, name, node string, labels map[string]string, restart corev1.RestartPolicy, args ...string) *corev1.Pod {
	zero := int64(0)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 restart,
			TerminationGracePeriodSeconds: &zero,
			Containers: []corev1.Container{{
				Name: "agnhost", Image: AgnhostImage, ImagePullPolicy: corev1.PullNever, Args: args,
			}},
		},
	}
}

// podWhy summarizes why a pod is not where it should be.
func podWhy(p *corev1.Pod) string {
	var why []string
	for _, s := range p.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil {
			why = append(why, w.Reason+": "+w.Message)
		}
	}
	for _, cond := range p.Status.Conditions {
		if cond.Status != corev1.ConditionTrue && cond.Message != "" {
			why = append(why, cond.Message)
		}
	}
	return strings.Join(why, "; ")
}
