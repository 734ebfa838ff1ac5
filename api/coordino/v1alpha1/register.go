package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of every Coordino resource.
const GroupName = "coordino.io"

// SchemeGroupVersion is coordino.io/v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

// Resource qualifies a resource name with the group (for errors and listers).
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

var (
	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the coordino.io/v1alpha1 types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&IPPool{}, &IPPoolList{},
		&NodeConfig{}, &NodeConfigList{},
		&IPBlock{}, &IPBlockList{},
		&Identity{}, &IdentityList{},
		&PolicyIR{}, &PolicyIRList{},
		&NodeIsolationPolicy{}, &NodeIsolationPolicyList{},
		&NodeEndpoints{}, &NodeEndpointsList{},
		&BGPPeerPolicy{}, &BGPPeerPolicyList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
