package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Identity number ranges (24 bits of the datapath's identity field).
const (
	// MinClusterIdentity..MaxClusterIdentity are numbers the leader
	// controller gives to Identity objects.
	MinClusterIdentity = 256
	MaxClusterIdentity = 0x7FFFFF
	// MinLocalIdentity..MaxLocalIdentity are temporary node-local numbers a
	// daemon uses until the cluster Identity of a label set exists.
	MinLocalIdentity = 0x800000
	MaxLocalIdentity = 0xFFFFFF
)

// LabelSetHashLabel is the Identity label holding LabelSetHash(namespace,
// labels), so daemons and the controller find the Identity of a label set
// with a label selector or an index.
const LabelSetHashLabel = "coordino.io/label-set-hash"

// Identity is the cluster-wide number of one security-relevant label set.
// Its name is the number in decimal; only the leader controller creates
// Identities, and the name is the lock (AlreadyExists: take the next number).
// The spec never changes.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=cid,categories=coordino
// +kubebuilder:printcolumn:name="Namespace",type=string,JSONPath=`.spec.namespace`
// +kubebuilder:printcolumn:name="Labels",type=string,JSONPath=`.spec.labels`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[1-9][0-9]{2,6}$') && int(self.metadata.name) >= 256 && int(self.metadata.name) <= 8388607",message="name must be the identity number in decimal, 256..8388607"
type Identity struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec IdentitySpec `json:"spec"`
}

// IdentitySpec is the label set. See SecurityLabels for how it is formed.
//
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable"
type IdentitySpec struct {
	// Namespace of the pods with this identity.
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
	// Labels: the pod's labels minus the excluded keys, plus the namespace's
	// labels with keys prefixed "coordino.io/ns.".
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
}

// IdentityList is a list of Identities.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type IdentityList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Identity `json:"items"`
}
