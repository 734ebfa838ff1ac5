package k8s

import (
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

func TestLastKnownRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if lk, err := loadLastKnown(dir); lk != nil || err != nil {
		t.Fatalf("empty dir: %v, %v", lk, err)
	}
	in := &lastKnown{
		Blocks:     []coordinov1alpha1.NodeBlock{{CIDR: "10.0.0.0/26", Pool: "p", Releasing: true}},
		Generation: 7,
		Pods:       map[string]knownPod{"ns/a": {UID: "u1", Labels: map[string]string{"app": "a"}}},
		Namespaces: map[string]map[string]string{"ns": {"team": "x"}},
		Identities: map[string]coordinov1alpha1.IdentitySpec{"4711": {Namespace: "ns", Labels: map[string]string{"app": "a"}}},
		PolicyIRs: []*coordinov1alpha1.PolicyIR{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
			Spec: coordinov1alpha1.PolicyIRSpec{PolicyTypes: []string{"Ingress"}, Rules: []coordinov1alpha1.PolicyRule{{Direction: "Ingress"}}}}},
	}
	if err := in.save(dir); err != nil {
		t.Fatal(err)
	}
	out, err := loadLastKnown(dir)
	if err != nil || out.Generation != 7 || !out.Blocks[0].Releasing || out.Pods["ns/a"].UID != "u1" ||
		out.Namespaces["ns"]["team"] != "x" || out.Identities["4711"].Labels["app"] != "a" ||
		len(out.PolicyIRs) != 1 || out.PolicyIRs[0].Name != "p" || out.PolicyIRs[0].Spec.Rules[0].Direction != "Ingress" {
		t.Fatalf("round trip: %+v, %v", out, err)
	}
	// A damaged file is an error, not a panic or an empty state.
	if err := os.WriteFile(filepath.Join(dir, lastKnownFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadLastKnown(dir); err == nil {
		t.Fatal("damaged last-known state accepted")
	}
}

// The file's stamp: an unstamped file (the releases before stamps) and a
// newer additive one are read; one too new is refused naming the versions,
// and the refusal leaves the file as it was.
func TestLastKnownSchema(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, lastKnownFile)
	for _, tc := range []struct {
		file, err string
	}{
		{`{"generation":3}`, ""},
		{`{"schema":{"version":3,"minReader":2},"generation":3,"newField":[1]}`, ""},
		{`{"schema":{"version":4,"minReader":3},"generation":3}`, "last-known cluster state " + path + " has schema version 4, readable by version 3 and later; this build reads versions up to 2"},
	} {
		if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		lk, err := loadLastKnown(dir)
		if tc.err == "" {
			if err != nil || lk.Generation != 3 {
				t.Errorf("%s: %+v, %v", tc.file, lk, err)
			}
			continue
		}
		if err == nil || err.Error() != tc.err+": refusing to use it and leaving it untouched (run a release that reads version 3, or remove the state to start afresh)" {
			t.Errorf("%s: error %v, want %q", tc.file, err, tc.err)
		}
		if data, _ := os.ReadFile(path); string(data) != tc.file {
			t.Errorf("refused file rewritten: %s", data)
		}
	}
	// What this build saves carries its stamp.
	if err := (&lastKnown{Generation: 1}).save(dir); err != nil {
		t.Fatal(err)
	}
	if lk, err := loadLastKnown(dir); err != nil || lk.Schema != LastKnownFormat.Stamp() {
		t.Fatalf("saved stamp %+v, %v", lk, err)
	}
}

// TestLastKnownLoadRemovesKilledSave: a daemon killed during a save (the
// pod replaced mid-write) left a temporary file; the next start removes it
// and reads the state of the save before.
func TestLastKnownLoadRemovesKilledSave(t *testing.T) {
	dir := t.TempDir()
	if err := (&lastKnown{Generation: 3}).save(dir); err != nil {
		t.Fatal(err)
	}
	left := filepath.Join(dir, ".tmp-"+lastKnownFile+"-2856450844")
	if err := os.WriteFile(left, []byte(`{"generation":`), 0o600); err != nil {
		t.Fatal(err)
	}
	lk, err := loadLastKnown(dir)
	if err != nil || lk == nil || lk.Generation != 3 {
		t.Fatalf("load: %+v, %v; want the earlier save", lk, err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("temporary file of the killed save still there: %v", err)
	}
}
