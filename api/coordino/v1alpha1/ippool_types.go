package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Default block sizes (prefix lengths) of a node block.
const (
	DefaultBlockSizeIPv4 = 26
	DefaultBlockSizeIPv6 = 122
)

// ConditionExhausted is the IPPool condition set while a node that the pool
// selects needs a block and the pool has none left.
const ConditionExhausted = "Exhausted"

// IPPool is a range of pod addresses the controller hands out to nodes in
// fixed-size blocks.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ipp,categories=coordino
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="CIDRs",type=string,JSONPath=`.spec.cidrs`
// +kubebuilder:printcolumn:name="Block4",type=integer,JSONPath=`.status.families[?(@.family=="IPv4")].blockSize`
// +kubebuilder:printcolumn:name="Block6",type=integer,JSONPath=`.status.families[?(@.family=="IPv6")].blockSize`
// +kubebuilder:printcolumn:name="Allocated",type=integer,JSONPath=`.status.allocatedBlocks`
// +kubebuilder:printcolumn:name="Total",type=integer,JSONPath=`.status.totalBlocks`
// +kubebuilder:printcolumn:name="Exhausted",type=string,JSONPath=`.status.conditions[?(@.type=="Exhausted")].status`
// +kubebuilder:printcolumn:name="Disabled",type=boolean,JSONPath=`.spec.disabled`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   IPPoolSpec   `json:"spec"`
	Status IPPoolStatus `json:"status,omitempty"`
}

// IPPoolSpec says which addresses a pool owns and how it cuts them.
//
// +kubebuilder:validation:XValidation:rule="self.cidrs.all(c, !isCIDR(c) || cidr(c).ip().family() != 4 || cidr(c).prefixLength() <= self.blockSizeIPv4)",message="every IPv4 CIDR must be at least as large as blockSizeIPv4"
// +kubebuilder:validation:XValidation:rule="self.cidrs.all(c, !isCIDR(c) || cidr(c).ip().family() != 6 || cidr(c).prefixLength() <= self.blockSizeIPv6)",message="every IPv6 CIDR must be at least as large as blockSizeIPv6"
type IPPoolSpec struct {
	// CIDRs are the pool's IPv4 and/or IPv6 ranges in canonical form
	// (host bits zero), e.g. 10.244.0.0/16 or fd00:10:244::/56.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +listType=set
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self) && cidr(self) == cidr(self).masked()",message="must be a CIDR with host bits zero, e.g. 10.244.0.0/16"
	CIDRs []string `json:"cidrs"`

	// BlockSizeIPv4 is the prefix length of one node block cut from an IPv4
	// CIDR. Immutable: blocks already handed out keep their size.
	// +kubebuilder:default=26
	// +kubebuilder:validation:Minimum=16
	// +kubebuilder:validation:Maximum=30
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="blockSizeIPv4 is immutable"
	// +optional
	BlockSizeIPv4 int32 `json:"blockSizeIPv4,omitempty"`

	// BlockSizeIPv6 is the prefix length of one node block cut from an IPv6
	// CIDR. Immutable.
	// +kubebuilder:default=122
	// +kubebuilder:validation:Minimum=64
	// +kubebuilder:validation:Maximum=126
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="blockSizeIPv6 is immutable"
	// +optional
	BlockSizeIPv6 int32 `json:"blockSizeIPv6,omitempty"`

	// NodeSelector limits the pool to nodes with these labels; empty
	// selects every node.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Disabled stops new blocks from this pool; blocks already held stay.
	// +optional
	Disabled bool `json:"disabled,omitempty"`

	// NatOutgoing masquerades the pool's pods' traffic to destinations
	// outside the cluster (every pod CIDR, node address and Service range,
	// and the daemons' non-masquerade CIDRs) to their node's address.
	// Unset means true; false lets them leave with their own address, for
	// pods routed in the network beyond the nodes. Daemons with
	// --masquerade=false masquerade no pool.
	// +optional
	NatOutgoing *bool `json:"natOutgoing,omitempty"`
}

// NATOutgoing reports the pool's natOutgoing (true when unset).
func (s *IPPoolSpec) NATOutgoing() bool { return s.NatOutgoing == nil || *s.NatOutgoing }

// IPPoolStatus is written by the leader controller.
type IPPoolStatus struct {
	// TotalBlocks is how many blocks the pool's CIDRs hold (saturates at
	// 2^31-1, which large IPv6 pools exceed).
	// +optional
	TotalBlocks int32 `json:"totalBlocks,omitempty"`
	// AllocatedBlocks is how many of them nodes hold.
	// +optional
	AllocatedBlocks int32 `json:"allocatedBlocks,omitempty"`
	// Families breaks the counts down per address family.
	// +optional
	// +listType=map
	// +listMapKey=family
	Families []PoolFamilyStatus `json:"families,omitempty"`
	// Conditions: "Exhausted" (True while a node waits for a block).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PoolFamilyStatus counts one address family's blocks.
type PoolFamilyStatus struct {
	// Family is "IPv4" or "IPv6".
	// +kubebuilder:validation:Enum=IPv4;IPv6
	Family string `json:"family"`
	// BlockSize is the prefix length of the family's blocks. Only the
	// families the pool's CIDRs have are listed, so the Block4 and Block6
	// columns of kubectl get show only the sizes the pool uses (spec
	// defaults both block sizes, whatever the CIDRs).
	// +optional
	BlockSize int32 `json:"blockSize,omitempty"`
	// TotalBlocks saturates at 2^31-1.
	TotalBlocks     int32 `json:"totalBlocks"`
	AllocatedBlocks int32 `json:"allocatedBlocks"`
}

// IPPoolList is a list of IPPools.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type IPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPPool `json:"items"`
}
