package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// Address families a BGP session carries (MP-BGP unicast).
const (
	BGPFamilyIPv4 = "IPv4"
	BGPFamilyIPv6 = "IPv6"
)

// BGPPeerPolicy makes the nodes it selects, when their daemon runs with
// --routing=bgp, announce their pod blocks to the listed peers (the
// fabric's routers) and install the peers' routes to other nodes' blocks.
// A node selected by several policies takes the first by name and reports
// the others as ignored.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=bgpp,categories=coordino
// +kubebuilder:printcolumn:name="ASN",type=integer,JSONPath=`.spec.localASN`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BGPPeerPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec BGPPeerPolicySpec `json:"spec"`
}

// BGPPeerPolicySpec is the BGP speaker's configuration of the nodes it
// selects. The daemon's --bgp-config file holds the same fields.
type BGPPeerPolicySpec struct {
	// NodeSelector selects nodes by label; empty selects every node.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// LocalASN is the nodes' autonomous system number.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	LocalASN int64 `json:"localASN"`
	// ListenPort is where the speaker accepts sessions (default 179; -1:
	// it only connects out).
	// +optional
	// +kubebuilder:validation:Minimum=-1
	// +kubebuilder:validation:Maximum=65535
	ListenPort int32 `json:"listenPort,omitempty"`
	// RestartTimeSeconds is the graceful-restart time (RFC 4724) the
	// speaker announces: how long peers keep its routes while its daemon
	// restarts, and how long a restarted daemon keeps the routes it had
	// installed before the peers send them again. Default 120; 0 takes
	// the default.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4095
	RestartTimeSeconds int32 `json:"restartTimeSeconds,omitempty"`
	// ServiceSelector selects the Services whose addresses the nodes
	// announce as host routes (/32, /128), next hop the node: each
	// LoadBalancer ingress IP and externalIP. A Service with
	// externalTrafficPolicy Local is announced only by nodes with a
	// ready endpoint of it, so the fabric sends its traffic where it is
	// served without a second hop; any other by every selected node.
	// Unset: no Service addresses are announced. Standalone mode has no
	// Services and ignores it.
	// +optional
	ServiceSelector *metav1.LabelSelector `json:"serviceSelector,omitempty"`
	// Peers are the routers the nodes open sessions to.
	// +listType=atomic
	// +kubebuilder:validation:MinItems=1
	Peers []BGPPeer `json:"peers"`
}

// BGPPeer is one BGP neighbour.
type BGPPeer struct {
	// Address is the peer's IPv4 or IPv6 address.
	Address string `json:"address"`
	// ASN is the peer's autonomous system number (equal to localASN: iBGP).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	ASN int64 `json:"asn"`
	// Port is the peer's BGP port (default 179).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`
	// PasswordSecretRef names the Secret key holding the TCP MD5 password
	// (RFC 2385), in the daemon's namespace. In the --bgp-config file it is
	// passwordFile instead.
	// +optional
	PasswordSecretRef *SecretKeyRef `json:"passwordSecretRef,omitempty"`
	// PasswordFile is the file holding the TCP MD5 password (standalone).
	// +optional
	PasswordFile string `json:"passwordFile,omitempty"`
	// HoldTimeSeconds (default 90; at least 3) and KeepaliveSeconds
	// (default a third of it).
	// +optional
	// +kubebuilder:validation:Minimum=3
	// +kubebuilder:validation:Maximum=65535
	HoldTimeSeconds int32 `json:"holdTimeSeconds,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=21845
	KeepaliveSeconds int32 `json:"keepaliveSeconds,omitempty"`
	// Families the session carries (default both).
	// +optional
	// +listType=set
	// +kubebuilder:validation:items:Enum=IPv4;IPv6
	Families []string `json:"families,omitempty"`
	// MaxPrefixes ends the session when the peer sends more prefixes of a
	// family (default 10000).
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxPrefixes int32 `json:"maxPrefixes,omitempty"`
}

// SecretKeyRef names one key of a Secret.
type SecretKeyRef struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// BGPPeerPolicyList is a list of BGPPeerPolicy.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type BGPPeerPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BGPPeerPolicy `json:"items"`
}
