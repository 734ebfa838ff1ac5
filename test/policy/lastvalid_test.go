package policy

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// brokenFileAtRestart: a policy file that is broken while the daemon is
// down keeps enforcing its last valid content after the restart (the
// daemon saved it in its state dir), and the breakage is reported.
func (b *bed) brokenFileAtRestart(t *testing.T) {
	b.t = t
	xa := peer{"x", "a"}
	if err := b.apply(xaFrom("from-b", `  - podSelector: {matchLabels: {pod: b}}`)); err != nil {
		t.Fatal(err)
	}
	want := allow().set(anyPod, xa.sel(), allSvc, false).set(pod("x", "b"), xa.sel(), allSvc, true)
	if err := b.node.StopDaemon(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	broken := []byte("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: from-b, namespace: x}\nspec: {podSelector: {}, policyTypes: [Sideways]}\n")
	if err := os.WriteFile(filepath.Join(b.policyDir, policyFile), broken, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := b.node.StartDaemon(); err != nil {
		t.Fatal(err)
	}
	if v, err := b.node.Metric("coordino_policy_files_invalid"); err != nil || v != 1 {
		t.Fatalf("coordino_policy_files_invalid = %v (%v), want 1", v, err)
	}
	if err := b.expectMatrix(want); err != nil {
		t.Fatalf("after a restart with the policy file broken: %v", err)
	}
	// Repairing the file (to no policy) opens x/a again.
	if err := b.node.WritePolicy(b.policyDir, policyFile, []byte{}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.expectMatrix(allow()); err != nil {
		t.Fatalf("after repairing the file: %v", err)
	}
}
