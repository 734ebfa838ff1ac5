package v1alpha1

import "testing"

func TestSecurityLabelsExcludeAndPrefix(t *testing.T) {
	got := SecurityLabels(
		map[string]string{"app": "web", "pod-template-hash": "abc"},
		map[string]string{"team": "a"},
		DefaultExcludedLabels)
	want := map[string]string{"app": "web", "coordino.io/ns.team": "a"}
	if len(got) != len(want) || got["app"] != "web" || got["coordino.io/ns.team"] != "a" {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestLabelSetHash(t *testing.T) {
	a := LabelSetHash("ns", map[string]string{"a": "1", "b": "2"})
	if a != LabelSetHash("ns", map[string]string{"b": "2", "a": "1"}) {
		t.Fatal("hash depends on map order")
	}
	for _, other := range []string{
		LabelSetHash("ns2", map[string]string{"a": "1", "b": "2"}),
		LabelSetHash("ns", map[string]string{"a": "1", "b": "3"}),
		LabelSetHash("ns", map[string]string{"a": "1=b", "": "2"}),
		LabelSetHash("ns", map[string]string{"a": "1"}),
	} {
		if other == a {
			t.Fatal("different label sets share a hash")
		}
	}
	if len(a) != 40 {
		t.Fatalf("hash %q is not 40 hex characters", a)
	}
}

// TestSecurityLabelSetHashMatchesTheSet: the streaming hash equals the hash
// of the built set, also where pod keys sort around the namespace prefix.
func TestSecurityLabelSetHashMatchesTheSet(t *testing.T) {
	for _, pod := range []map[string]string{
		{},
		{"app": "web", "pod-template-hash": "x"},
		{"coordino.io/na": "1", "coordino.io/ns": "2", "coordino.io/ns.a": "3", "coordino.io/nt": "4", "coordino.io": "5", "z": "6"},
	} {
		for _, ns := range []map[string]string{{}, {"a": "1", "kubernetes.io/metadata.name": "x"}, {"": "e"}} {
			want := LabelSetHash("x", SecurityLabels(pod, ns, DefaultExcludedLabels))
			if got := SecurityLabelSetHash("x", pod, ns, DefaultExcludedLabels); got != want {
				t.Errorf("pod %v ns %v: %s, want %s", pod, ns, got, want)
			}
		}
	}
}

// FuzzSecurityLabelSetHash checks the same on arbitrary keys.
func FuzzSecurityLabelSetHash(f *testing.F) {
	f.Add("coordino.io/ns.a", "coordino.io/n", "a", "pod-template-hash")
	f.Add("", "coordino.io/ns.", "", "x")
	f.Fuzz(func(t *testing.T, p1, p2, n1, n2 string) {
		pod := map[string]string{p1: "1", p2: "2"}
		ns := map[string]string{n1: "3", n2: "4"}
		merged := SecurityLabels(pod, ns, DefaultExcludedLabels)
		if got, want := SecurityLabelSetHash("n", pod, ns, DefaultExcludedLabels), LabelSetHash("n", merged); got != want {
			t.Fatalf("pod %q ns %q: %s, want %s", pod, ns, got, want)
		}
	})
}
