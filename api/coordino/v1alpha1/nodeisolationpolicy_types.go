package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Scopes of a node isolation rule: the pod's own node, other nodes, or both.
const (
	ScopeOwnNode    = "OwnNode"
	ScopeOtherNodes = "OtherNodes"
	ScopeAllNodes   = "AllNodes"
)

// Directions a NodeIsolationPolicy can isolate.
const (
	// PolicyTypePodToHost isolates pods from node addresses: a pod opens a
	// flow to its own node or another node only on a PodToHost port.
	PolicyTypePodToHost = "PodToHost"
	// PolicyTypeNodeToNode isolates nodes from each other: a node accepts a
	// new flow from another node only on a NodeToNode port.
	PolicyTypeNodeToNode = "NodeToNode"
)

// NodeIsolationPolicy says which host ports pods may reach on nodes and
// which node-to-node traffic is allowed. Without any NodeIsolationPolicy
// nothing is isolated; with several, a direction is isolated when one of
// them isolates it and the allowed ports are the union of their rules.
// Traffic from a node to its own pods (kubelet probes) is never isolated.
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
	// PolicyTypes are the directions this policy isolates. Unset, it is
	// PodToHost, plus NodeToNode when nodeToNode lists rules (as
	// NetworkPolicy infers Egress from egress rules).
	// +optional
	// +listType=set
	// +kubebuilder:validation:items:Enum=PodToHost;NodeToNode
	PolicyTypes []string `json:"policyTypes,omitempty"`
	// PodToHost: ports on nodes that pods may open.
	// +optional
	// +listType=atomic
	PodToHost []HostPortRule `json:"podToHost,omitempty"`
	// NodeToNode: ports nodes may open on each other's addresses (the
	// scope is ignored). The tunnel's own UDP port (WireGuard, VXLAN) is
	// always allowed.
	// +optional
	// +listType=atomic
	NodeToNode []HostPortRule `json:"nodeToNode,omitempty"`
}

// HostPortRule allows one protocol and port range towards a scope of nodes.
// Port 0 (unset) means every port; EndPort, when set, ends an inclusive
// range starting at Port. ICMP means echo requests of both families and
// takes no port.
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
