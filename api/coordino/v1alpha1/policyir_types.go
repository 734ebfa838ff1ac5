package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// PolicyIRSpec is a NetworkPolicy after validation and normalization:
// defaults explicit (policyTypes always the effective ones, a peer's pod
// selector always set), CIDRs canonical, ports as protocol ranges. It stays
// selector-based: identities are not expanded here, so an object changes
// only when its NetworkPolicy does, and each daemon matches the selectors
// against the label sets of its own endpoints and their peers.
type PolicyIRSpec struct {
	// PodSelector selects the pods of the namespace the policy applies to.
	PodSelector metav1.LabelSelector `json:"podSelector"`
	// PolicyTypes are the directions the policy isolates: "Ingress"
	// and/or "Egress". Empty for an invalid NetworkPolicy (isolates nothing).
	// +listType=set
	// +kubebuilder:validation:items:Enum=Ingress;Egress
	PolicyTypes []string `json:"policyTypes"`
	// Rules are the allow rules of both directions, ingress first.
	// +optional
	// +listType=atomic
	Rules []PolicyRule `json:"rules,omitempty"`
	// Warnings name rule parts that match nothing.
	// +optional
	// +listType=atomic
	Warnings []string `json:"warnings,omitempty"`
}

// PolicyRule allows traffic in one direction between the selected pods and
// any of Peers on any of Ports or NamedPorts. Empty Peers means every peer;
// empty Ports and NamedPorts every port unless NoPorts is set.
type PolicyRule struct {
	// +kubebuilder:validation:Enum=Ingress;Egress
	Direction string `json:"direction"`
	// +optional
	// +listType=atomic
	Peers []PolicyPeer `json:"peers,omitempty"`
	// +optional
	// +listType=atomic
	Ports []PolicyPortRange `json:"ports,omitempty"`
	// NamedPorts are container port names each daemon resolves from the
	// pods' container ports: an ingress rule's against the selected pod,
	// an egress rule's against the peer pods.
	// +optional
	// +listType=atomic
	NamedPorts []PolicyNamedPort `json:"namedPorts,omitempty"`
	// NoPorts marks a rule that matches no traffic at all (Compile no
	// longer emits it: named ports travel in NamedPorts).
	// +optional
	NoPorts bool `json:"noPorts,omitempty"`
}

// PolicyPeer is either pods chosen by selectors or an ipBlock.
type PolicyPeer struct {
	// NamespaceSelector picks the peer's namespaces; absent means the
	// policy's own namespace.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// PodSelector picks pods in those namespaces (empty: all of them). Set
	// for every selector peer, absent for an ipBlock peer.
	// +optional
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
	// +optional
	IPBlock *PolicyIPBlock `json:"ipBlock,omitempty"`
}

// PolicyIPBlock is a canonical CIDR minus the CIDRs in Except.
type PolicyIPBlock struct {
	// +kubebuilder:validation:MaxLength=43
	CIDR string `json:"cidr"`
	// +optional
	// +listType=atomic
	Except []string `json:"except,omitempty"`
}

// PolicyPortRange is an inclusive port range of one IP protocol; protocol
// 0 means every protocol, 0-65535 every port.
type PolicyPortRange struct {
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=255
	Protocol int32 `json:"protocol"`
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	First int32 `json:"first"`
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	Last int32 `json:"last"`
}

// PolicyNamedPort is a container port name of one IP protocol (0: every
// protocol).
type PolicyNamedPort struct {
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=255
	Protocol int32 `json:"protocol"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=15
	Name string `json:"name"`
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
