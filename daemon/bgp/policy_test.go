package bgp

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

func TestSelectFirstMatchingByName(t *testing.T) {
	pol := func(name string, sel map[string]string) coordinov1alpha1.BGPPeerPolicy {
		return coordinov1alpha1.BGPPeerPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinov1alpha1.BGPPeerPolicySpec{NodeSelector: sel}}
	}
	ps := []coordinov1alpha1.BGPPeerPolicy{
		pol("rack-b", map[string]string{"rack": "b"}),
		pol("z-all", nil),
		pol("rack-a", map[string]string{"rack": "a"}),
	}
	got, ignored := Select(ps, map[string]string{"rack": "a"})
	if got == nil || got.Name != "rack-a" || !slices.Equal(ignored, []string{"z-all"}) {
		t.Errorf("rack a: %v, ignored %v", got, ignored)
	}
	if got, _ := Select(ps, map[string]string{"rack": "c"}); got == nil || got.Name != "z-all" {
		t.Errorf("rack c: %v, want the policy selecting every node", got)
	}
	if got, _ := Select(ps[:1], nil); got != nil {
		t.Errorf("no match: %v", got)
	}
}
