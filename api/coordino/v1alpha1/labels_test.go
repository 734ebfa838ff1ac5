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
