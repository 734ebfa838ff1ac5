package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// PodCIDRsPool is NodeBlock.Pool for blocks copied from Node.spec.podCIDRs
// (controller --ipam=kubernetes). It cannot be an IPPool's name: object
// names are lower case.
const PodCIDRsPool = "Node.spec.podCIDRs"

// NodeConfig is everything one node's daemon needs from the cluster that is
// specific to the node: its address blocks (spec, written by the controller)
// and what the daemon reports back (status, written by that node's daemon).
// Its name is the Node's name.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=nc,categories=coordino
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Blocks",type=string,JSONPath=`.spec.blocks[*].cidr`
// +kubebuilder:printcolumn:name="Used",type=string,JSONPath=`.status.blocks[*].used`
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=`.status.addresses`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeConfig struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeConfigSpec   `json:"spec,omitempty"`
	Status NodeConfigStatus `json:"status,omitempty"`
}

// NodeConfigSpec is written by the controller only.
type NodeConfigSpec struct {
	// Blocks are the pod address blocks the node may allocate from.
	// +optional
	// +listType=map
	// +listMapKey=cidr
	// +kubebuilder:validation:MaxItems=1024
	Blocks []NodeBlock `json:"blocks,omitempty"`
}

// NodeBlock is one block held by the node.
type NodeBlock struct {
	// CIDR of the block, canonical form.
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self) == cidr(self).masked()",message="must be a CIDR with host bits zero"
	CIDR string `json:"cidr"`
	// Pool is the IPPool it was cut from, or "Node.spec.podCIDRs".
	// +kubebuilder:validation:MaxLength=253
	Pool string `json:"pool"`
	// Releasing asks the daemon to stop allocating from the block; the
	// controller removes the block once status shows it unused (used == 0)
	// at an observedGeneration that includes this flag.
	// +optional
	Releasing bool `json:"releasing,omitempty"`
}

// NodeConfigStatus is written by the node's daemon only.
type NodeConfigStatus struct {
	// Blocks reports the use of each block in spec.
	// +optional
	// +listType=map
	// +listMapKey=cidr
	// +kubebuilder:validation:MaxItems=1024
	Blocks []BlockUsage `json:"blocks,omitempty"`
	// Addresses are the node's underlay IPs that other nodes route pod
	// traffic to.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=39
	// +kubebuilder:validation:items:XValidation:rule="isIP(self)",message="must be an IP address"
	Addresses []string `json:"addresses,omitempty"`
	// WireGuard is set when the node encrypts pod traffic.
	// +optional
	WireGuard *WireGuardStatus `json:"wireGuard,omitempty"`
	// BGP lists the node's BGP sessions when it routes with --routing=bgp.
	// +optional
	// +listType=map
	// +listMapKey=address
	// +kubebuilder:validation:MaxItems=64
	BGP []BGPSessionStatus `json:"bgp,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ObservedGeneration is the spec generation the daemon has applied
	// (stopped allocating from releasing blocks included).
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// BlockUsage is the daemon's count of addresses in use in one block.
type BlockUsage struct {
	// +kubebuilder:validation:MaxLength=43
	CIDR string `json:"cidr"`
	// +kubebuilder:validation:Minimum=0
	Used int32 `json:"used"`
	// +kubebuilder:validation:Minimum=0
	Capacity int32 `json:"capacity"`
}

// WireGuardStatus publishes the node's WireGuard public key and endpoint.
type WireGuardStatus struct {
	// PublicKey is base64 (never the private key).
	// +kubebuilder:validation:MaxLength=64
	PublicKey string `json:"publicKey"`
	// Endpoint is host:port.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
}

// BGPSessionStatus is one BGP session of the node's speaker.
type BGPSessionStatus struct {
	// Address is the peer's.
	// +kubebuilder:validation:MaxLength=39
	Address string `json:"address"`
	// +kubebuilder:validation:Minimum=0
	ASN int64 `json:"asn"`
	// State: Idle, Connect, Active, OpenSent, OpenConfirm or Established.
	// +kubebuilder:validation:MaxLength=16
	State string `json:"state"`
	// Prefixes received from the peer, accepted of them, and sent to it.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Received int64 `json:"received,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	Accepted int64 `json:"accepted,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	Sent int64 `json:"sent,omitempty"`
	// Message says why the session last went down, when not Established.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	Message string `json:"message,omitempty"`
}

// NodeConfigList is a list of NodeConfigs.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type NodeConfigList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeConfig `json:"items"`
}
