package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
)

// NamespaceLabelPrefix prefixes namespace labels in an Identity's label set,
// so they never collide with pod labels.
const NamespaceLabelPrefix = "coordino.io/ns."

// DefaultExcludedLabels are pod label keys left out of identities by
// default: they differ per pod or per rollout and no policy selects on them,
// so keeping them would give every pod its own identity.
var DefaultExcludedLabels = []string{
	"pod-template-hash",
	"controller-revision-hash",
	"pod-template-generation",
	"statefulset.kubernetes.io/pod-name",
	"apps.kubernetes.io/pod-index",
	"batch.kubernetes.io/controller-uid",
	"batch.kubernetes.io/job-name",
	"controller-uid",
	"job-name",
}

// SecurityLabels forms the label set an identity stands for: the pod's
// labels without the excluded keys, plus every namespace label under
// NamespaceLabelPrefix. The daemon and the controller must use the same
// exclusion list, or they disagree on which Identity a pod has.
func SecurityLabels(podLabels, namespaceLabels map[string]string, excluded []string) map[string]string {
	out := make(map[string]string, len(podLabels)+len(namespaceLabels))
	for k, v := range podLabels {
		if !slices.Contains(excluded, k) {
			out[k] = v
		}
	}
	for k, v := range namespaceLabels {
		out[NamespaceLabelPrefix+k] = v
	}
	return out
}

// LabelSetHash is the stable hash of (namespace, labels) stored in an
// Identity's LabelSetHashLabel: the first 20 bytes of SHA-256 over the
// namespace and the sorted key=value pairs, hex (40 characters, within the
// 63 a label value allows). Collisions are treated as impossible; the
// controller still compares the full set before reusing an Identity.
func LabelSetHash(namespace string, labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString(namespace)
	for _, k := range keys {
		// NUL cannot appear in label keys, values or namespace names.
		b.WriteByte(0)
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(labels[k])
	}
	sum := sha256.Sum256([]byte(b.String()))
	return hex.EncodeToString(sum[:20])
}
