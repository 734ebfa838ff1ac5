package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Scopes of a node isolation rule: the pod's own node, other nodes, or both.
const (
	ScopeOwnNode    = "OwnNode"
	ScopeOtherNodes = "OtherNodes"
	ScopeAllNodes   = "AllNodes"
)

// NodeIsolationPolicy says which host ports pods may reach on nodes and
// which node-to-node traffic is allowed (filled in by the node isolation
// work; defined now so the API is whole).
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=nip,categories=coordino
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeIsolationPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeIsolationPolicySpec   `json:"spec"`
	Status NodeIsolationPolicyStatus `json:"status,omitempty"`
}

// NodeIsolationPolicySpec lists allowed host ports per direction.
type NodeIsolationPolicySpec struct {
	// PodToHost: ports on nodes that pods may open.
	// +optional
	// +listType=atomic
	PodToHost []HostPortRule `json:"podToHost,omitempty"`
	// NodeToNode: ports nodes may open on each other's pods/host.
	// +optional
	// +listType=atomic
	NodeToNode []HostPortRule `json:"nodeToNode,omitempty"`
}

// HostPortRule allows one protocol and port range towards a scope of nodes.
type HostPortRule struct {
	// +kubebuilder:validation:Enum=TCP;UDP;SCTP;ICMP
	Protocol string `json:"protocol"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	EndPort int32 `json:"endPort,omitempty"`
	// Scope: OwnNode, OtherNodes or AllNodes.
	// +kubebuilder:validation:Enum=OwnNode;OtherNodes;AllNodes
	// +kubebuilder:default=AllNodes
	Scope string `json:"scope"`
}

// NodeIsolationPolicyStatus reports application.
type NodeIsolationPolicyStatus struct {
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NodeIsolationPolicyList is a list of NodeIsolationPolicies.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type NodeIsolationPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeIsolationPolicy `json:"items"`
}
