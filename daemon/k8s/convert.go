package k8s

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"strconv"
	"strings"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
	"github.com/coordino/coordino/daemon/identity"
	"github.com/coordino/coordino/daemon/ipam"
)

// blockSpecs converts a NodeConfig's spec.blocks into IPAM blocks. Entries
// that are not canonical CIDRs are skipped and reported: the CRD schema
// rejects them, but an object written before that must not stop the node.
func blockSpecs(blocks []coordinov1alpha1.NodeBlock) ([]ipam.BlockSpec, error) {
	out := make([]ipam.BlockSpec, 0, len(blocks))
	var errs []error
	for i, b := range blocks {
		p, err := netip.ParsePrefix(b.CIDR)
		if err != nil {
			errs = append(errs, fmt.Errorf("spec.blocks[%d].cidr %q: %w", i, b.CIDR, err))
			continue
		}
		if p != p.Masked() {
			errs = append(errs, fmt.Errorf("spec.blocks[%d].cidr %q: host bits set (want %v)", i, b.CIDR, p.Masked()))
			continue
		}
		out = append(out, ipam.BlockSpec{Prefix: p, Releasing: b.Releasing})
	}
	return out, errors.Join(errs...)
}

// clusterIdentity converts an Identity object into the datapath's form and
// the hash of its label set. The datapath identity carries the pod part of
// the label set only: policy evaluates namespace selectors against the
// Namespace objects, so the namespace labels (under NamespaceLabelPrefix)
// serve to tell label sets apart, not to match.
func clusterIdentity(obj *coordinov1alpha1.Identity) (identity.Identity, string, error) {
	n, err := strconv.ParseUint(obj.Name, 10, 32)
	if err != nil || strconv.FormatUint(n, 10) != obj.Name {
		return identity.Identity{}, "", fmt.Errorf("identity %q: name is not a decimal identity number", obj.Name)
	}
	id := identity.ID(n)
	if id < identity.FirstPod || id > identity.LastCluster {
		return identity.Identity{}, "", fmt.Errorf("identity %q: number outside the cluster range %d..%d", obj.Name, identity.FirstPod, identity.LastCluster)
	}
	if obj.Spec.Namespace == "" {
		return identity.Identity{}, "", fmt.Errorf("identity %q: spec.namespace is empty", obj.Name)
	}
	pod := maps.Clone(obj.Spec.Labels)
	maps.DeleteFunc(pod, func(k, _ string) bool { return strings.HasPrefix(k, coordinov1alpha1.NamespaceLabelPrefix) })
	if pod == nil {
		pod = map[string]string{}
	}
	hash := coordinov1alpha1.LabelSetHash(obj.Spec.Namespace, obj.Spec.Labels)
	return identity.Identity{ID: id, Namespace: obj.Spec.Namespace, Labels: pod}, hash, nil
}
