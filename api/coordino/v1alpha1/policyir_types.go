package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ConditionValid is PolicyIR's condition: False with a reason when the
// NetworkPolicy could not be compiled.
const ConditionValid = "Valid"

// PolicyIR is the normalized, selector-based form of one NetworkPolicy, in
// the NetworkPolicy's namespace and with its name. The controller writes it;
// daemons apply the parts that concern their endpoints.
//
// +genclient
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=pir,categories=coordino
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Types",type=string,JSONPath=`.spec.policyTypes`
// +kubebuilder:printcolumn:name="Valid",type=string,JSONPath=`.status.conditions[?(@.type=="Valid")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PolicyIR struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PolicyIRSpec   `json:"spec"`
	Status PolicyIRStatus `json:"status,omitempty"`
}

// PolicyIRSpec mirrors networking.k8s.io/v1 NetworkPolicySpec with every
// default made explicit (policyTypes always set).
type PolicyIRSpec struct {
	// PodSelector selects the pods of the namespace the policy applies to.
	PodSelector metav1.LabelSelector `json:"podSelector"`
	// PolicyTypes: "Ingress" and/or "Egress".
	// +listType=set
	// +kubebuilder:validation:items:Enum=Ingress;Egress
	PolicyTypes []string `json:"policyTypes"`
	// +optional
	// +listType=atomic
	Ingress []PolicyRule `json:"ingress,omitempty"`
	// +optional
	// +listType=atomic
	Egress []PolicyRule `json:"egress,omitempty"`
}

// PolicyRule allows traffic from/to any of Peers on any of Ports. Empty
// Peers means every peer, empty Ports every port.
type PolicyRule struct {
	// +optional
	// +listType=atomic
	Peers []PolicyPeer `json:"peers,omitempty"`
	// +optional
	// +listType=atomic
	Ports []PolicyPort `json:"ports,omitempty"`
}

// PolicyPeer is one NetworkPolicyPeer: selectors or an ipBlock.
type PolicyPeer struct {
	// +optional
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// +optional
	IPBlock *PolicyIPBlock `json:"ipBlock,omitempty"`
}

// PolicyIPBlock is a CIDR with exceptions.
type PolicyIPBlock struct {
	// +kubebuilder:validation:MaxLength=43
	CIDR string `json:"cidr"`
	// +optional
	// +listType=atomic
	Except []string `json:"except,omitempty"`
}

// PolicyPort is a protocol with a port (number or named) or range.
type PolicyPort struct {
	// +kubebuilder:validation:Enum=TCP;UDP;SCTP
	// +kubebuilder:default=TCP
	Protocol string `json:"protocol"`
	// +optional
	Port *intstr.IntOrString `json:"port,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	EndPort *int32 `json:"endPort,omitempty"`
}

// PolicyIRStatus reports compilation.
type PolicyIRStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PolicyIRList is a list of PolicyIRs.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type PolicyIRList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PolicyIR `json:"items"`
}
