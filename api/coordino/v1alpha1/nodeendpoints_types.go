package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// MaxNodeEndpoints bounds the entries of one NodeEndpoints object: far
// above any node's pod count, and small enough that the object stays well
// under etcd's request limit (about 120 bytes an entry).
const MaxNodeEndpoints = 8192

// NodeEndpoints lists the pods of one node that other nodes must recognise
// by address: each pod's addresses with its cluster identity and named
// ports. Its name is the Node's name; only that node's daemon writes it
// (RBAC plus the admission policy in install/kubernetes), and the controller
// deletes it with the node. Every daemon watches all of them: one object a
// node keeps the watch fan-out proportional to nodes, not pods, and a
// change on one node sends one object to each watcher.
//
// A pod appears only once it holds a cluster identity; while it has a
// node-local temporary one it is left out, so other nodes see its address
// as an unknown (world) address for that moment, which policy allowing it
// by labels denies: fail closed.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=nep,categories=coordino
// +kubebuilder:printcolumn:name="Endpoints",type=integer,JSONPath=`.spec.endpointCount`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeEndpoints struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec NodeEndpointsSpec `json:"spec"`
}

// NodeEndpointsSpec is written by the node's daemon only.
type NodeEndpointsSpec struct {
	// EndpointCount is len(endpoints), for kubectl's columns.
	// +optional
	EndpointCount int32 `json:"endpointCount,omitempty"`
	// Endpoints are sorted by their first address.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8192
	Endpoints []NodeEndpoint `json:"endpoints,omitempty"`
}

// NodeEndpoint is one pod interface of the node.
type NodeEndpoint struct {
	// Addresses of the pod on this interface, at most one per family.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MaxLength=39
	// +kubebuilder:validation:items:XValidation:rule="isIP(self)",message="must be an IP address"
	Addresses []string `json:"addresses"`
	// Identity is the pod's cluster identity number (an Identity object's name).
	// +kubebuilder:validation:Minimum=256
	// +kubebuilder:validation:Maximum=8388607
	Identity int32 `json:"identity"`
	// NamedPorts are the pod's container ports that have a name, for
	// NetworkPolicy ports given by name.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	NamedPorts []NamedPort `json:"namedPorts,omitempty"`
}

// NamedPort is a container port with a name.
type NamedPort struct {
	// Name is the IANA_SVC_NAME of the port.
	// +kubebuilder:validation:MaxLength=15
	Name string `json:"name"`
	// Protocol is TCP, UDP or SCTP.
	// +kubebuilder:validation:Enum=TCP;UDP;SCTP
	Protocol string `json:"protocol"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
}

// NodeEndpointsList is a list of NodeEndpoints.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type NodeEndpointsList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeEndpoints `json:"items"`
}
