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
// 63 a label value allows). Collisions are treated as impossible.
func LabelSetHash(namespace string, labels map[string]string) string {
	return SecurityLabelSetHash(namespace, labels, nil, nil)
}

// SecurityLabelSetHash is LabelSetHash(namespace, SecurityLabels(podLabels,
// namespaceLabels, excluded)) without building the set: the daemon and the
// controller run it for every pod.
func SecurityLabelSetHash(namespace string, podLabels, namespaceLabels map[string]string, excluded []string) string {
	pk := make([]string, 0, len(podLabels))
	for k := range podLabels {
		if !slices.Contains(excluded, k) {
			pk = append(pk, k)
		}
	}
	nk := make([]string, 0, len(namespaceLabels))
	for k := range namespaceLabels {
		nk = append(nk, k)
	}
	slices.Sort(pk)
	slices.Sort(nk)
	buf := make([]byte, 0, 512)
	buf = append(buf, namespace...)
	pair := func(prefix, k, v string) {
		// NUL cannot appear in label keys, values or namespace names.
		buf = append(buf, 0)
		buf = append(buf, prefix...)
		buf = append(buf, k...)
		buf = append(buf, '=')
		buf = append(buf, v...)
	}
	// Merge the two sorted key lists as if the namespace keys carried
	// their prefix.
	i, j := 0, 0
	for i < len(pk) || j < len(nk) {
		c := -1
		if j < len(nk) && i < len(pk) {
			c = comparePrefixed(pk[i], NamespaceLabelPrefix, nk[j])
		} else if i == len(pk) {
			c = 1
		}
		switch {
		case c < 0:
			pair("", pk[i], podLabels[pk[i]])
			i++
		case c == 0:
			i++ // the namespace label wins, as in SecurityLabels
		default:
			pair(NamespaceLabelPrefix, nk[j], namespaceLabels[nk[j]])
			j++
		}
	}
	sum := sha256.Sum256(buf)
	return hex.EncodeToString(sum[:20])
}

// comparePrefixed compares a with prefix+b without concatenating.
func comparePrefixed(a, prefix, b string) int {
	if len(a) >= len(prefix) {
		if c := strings.Compare(a[:len(prefix)], prefix); c != 0 {
			return c
		}
		return strings.Compare(a[len(prefix):], b)
	}
	if c := strings.Compare(a, prefix[:len(a)]); c != 0 {
		return c
	}
	return -1 // a is a proper prefix of prefix+b
}
