package bgp

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// Select returns the BGPPeerPolicy that configures a node with nodeLabels:
// the first by name whose nodeSelector matches (an empty one matches every
// node), and the names of the other matching ones, which are ignored.
func Select(policies []coordinov1alpha1.BGPPeerPolicy, nodeLabels map[string]string) (*coordinov1alpha1.BGPPeerPolicy, []string) {
	var matching []*coordinov1alpha1.BGPPeerPolicy
	for i := range policies {
		if labels.SelectorFromSet(policies[i].Spec.NodeSelector).Matches(labels.Set(nodeLabels)) {
			matching = append(matching, &policies[i])
		}
	}
	if len(matching) == 0 {
		return nil, nil
	}
	slices.SortFunc(matching, func(a, b *coordinov1alpha1.BGPPeerPolicy) int { return strings.Compare(a.Name, b.Name) })
	var ignored []string
	for _, p := range matching[1:] {
		ignored = append(ignored, p.Name)
	}
	return matching[0], ignored
}
