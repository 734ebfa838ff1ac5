//go:build linux

package cluster

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPodProblemsNamesTheRuntimeError: when the nodes never become Ready,
// Up's error must carry what kept the daemon from starting (here the
// runtime's refusal of the Bidirectional /sys/fs/bpf mount seen on a host
// with its own bpffs), not only the node's "daemon unreachable".
func TestPodProblemsNamesTheRuntimeError(t *testing.T) {
	refusal := `failed to generate container "x" spec: failed to generate spec: path "/sys/fs/bpf" is mounted on "/sys/fs/bpf" but it is not a shared mount`
	pods := []corev1.Pod{{
		ObjectMeta: metav1.ObjectMeta{Name: "coordino-abcde"},
		Spec:       corev1.PodSpec{NodeName: "worker-1"},
		Status: corev1.PodStatus{
			Phase:      corev1.PodPending,
			Conditions: []corev1.PodCondition{{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", Message: "containers with unready status: [coordino]"}},
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "install-cni",
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "coordino",
				State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerError", Message: refusal}}}},
		},
	}, {
		ObjectMeta: metav1.ObjectMeta{Name: "coordino-fghij"},
		Spec:       corev1.PodSpec{NodeName: "worker-2"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "coordino", RestartCount: 3,
			State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 1, Message: "no IPPool selects this node"}}}}},
	}}
	got := podProblems(pods)
	for _, want := range []string{
		"coordino-abcde on worker-1 (Pending)",
		"container coordino waiting: CreateContainerError: " + refusal,
		"ContainersReady=False ContainersNotReady",
		"coordino-fghij on worker-2 (Running)",
		"container coordino last exit: Error (exit 1, 3 restarts): no IPPool selects this node",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("podProblems does not say %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "install-cni") {
		t.Errorf("podProblems reports a container that completed:\n%s", got)
	}
	if got := podProblems(nil); !strings.Contains(got, "none") {
		t.Errorf("podProblems(nil) = %q, want it to say there are none", got)
	}
}
