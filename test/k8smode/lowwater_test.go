package k8smode

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLowUsageReportedPromptly: an ADD that leaves the node below its
// low-water mark (here 16 free: a /27 holds 30) has the usage written to
// NodeConfig status within about a second, so the controller tops the node
// up before it fills, instead of at the next regular write 5 s later. The
// ADD goes right after a regular write, so without the prompt write the
// status could not change for about 5 s; the 3 s bound leaves room for a
// loaded machine either way. Fails on the old code (status stays at 14).
func TestLowUsageReportedPromptly(t *testing.T) {
	_, c, ns, node := setup(t, "10.67.0.0/27")
	for i := range 15 {
		c.pod(t, ns, fmt.Sprint("p", i), node.Name, otherLabels)
	}
	if err := node.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	used := func() (int32, string) {
		nc, err := c.crd.CoordinoV1alpha1().NodeConfigs().Get(context.Background(), node.Name, metav1.GetOptions{})
		if err != nil {
			return -1, err.Error()
		}
		if len(nc.Status.Blocks) != 1 {
			return -1, "status " + toJSON(nc.Status)
		}
		return nc.Status.Blocks[0].Used, "status " + toJSON(nc.Status)
	}
	for i := range 14 { // 16 free left: not below the mark
		node.add(t, ns, fmt.Sprint("p", i))
	}
	// Catch a regular write: the next one is 5 s away.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if n, _ := used(); n == 14 {
			break
		}
		if time.Now().After(deadline) {
			_, why := used()
			t.Fatalf("usage of 14 never reported: %s", why)
		}
		time.Sleep(20 * time.Millisecond)
	}
	node.add(t, ns, "p14")
	added := time.Now()
	for {
		n, why := used()
		if n == 15 {
			t.Logf("low usage reported %v after the ADD", time.Since(added).Round(10*time.Millisecond))
			return
		}
		if time.Since(added) > 3*time.Second {
			t.Fatalf("usage below the low-water mark not reported within 3 s of the ADD: %s", why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
