package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// IPBlock phases.
const (
	// BlockActive: the block belongs to spec.node and is (or is about to be)
	// listed in that node's NodeConfig.
	BlockActive = "Active"
	// BlockReleased: the node no longer uses the block; the controller is
	// removing it from the NodeConfig and then deletes this claim.
	BlockReleased = "Released"
)

// IPBlock is the cluster-wide claim on one block: its name is derived from
// the block's CIDR (BlockName), so the API server's create-if-absent makes a
// block belong to at most one node, also while two controllers overlap. It
// is written by the controller only; daemons read NodeConfig instead.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ipb,categories=coordino
// +kubebuilder:printcolumn:name="CIDR",type=string,JSONPath=`.spec.cidr`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.pool`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.spec.phase`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IPBlock struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec IPBlockSpec `json:"spec"`
}

// IPBlockSpec names the block's holder.
//
// +kubebuilder:validation:XValidation:rule="self.cidr == oldSelf.cidr && self.node == oldSelf.node && self.pool == oldSelf.pool",message="cidr, node and pool are immutable"
type IPBlockSpec struct {
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self) == cidr(self).masked()",message="must be a CIDR with host bits zero"
	CIDR string `json:"cidr"`
	// +kubebuilder:validation:MaxLength=253
	Pool string `json:"pool"`
	// Node is the holder's name (its NodeConfig's name).
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`
	// Phase is Active or Released; it only moves from Active to Released.
	// +kubebuilder:validation:Enum=Active;Released
	// +kubebuilder:validation:XValidation:rule="self == oldSelf || oldSelf == 'Active'",message="a Released block cannot become Active again"
	Phase string `json:"phase"`
}

// IPBlockList is a list of IPBlocks.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type IPBlockList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPBlock `json:"items"`
}
