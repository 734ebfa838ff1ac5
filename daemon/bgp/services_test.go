package bgp

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

func svc(name string, lbls map[string]string, local bool, external []string, ingress ...string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: lbls},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalIPs: external, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster}}
	if local {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	for _, ip := range ingress {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	return s
}

func slice(svcName, node string, ready *bool) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svcName + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.1.0.5"}, NodeName: &node, Conditions: discoveryv1.EndpointConditions{Ready: ready}}}}
}

// TestServiceRoutes: selected Services' externalIPs and load-balancer IPs
// as host routes; a Local Service only where it has a ready endpoint; the
// unselected and a nil selector announce nothing.
func TestServiceRoutes(t *testing.T) {
	yes, no := true, false
	announce := map[string]string{"bgp": "announce"}
	svcs := []*corev1.Service{
		svc("cluster", announce, false, []string{"192.0.2.10", "2001:db8:ff::10"}, "192.0.2.11"),
		svc("local-here", announce, true, nil, "192.0.2.20"),
		svc("local-elsewhere", announce, true, []string{"192.0.2.30"}),
		svc("local-not-ready", announce, true, []string{"192.0.2.40"}),
		svc("unselected", nil, false, []string{"192.0.2.50"}),
		svc("garbage", announce, false, []string{"not-an-ip"}),
	}
	ready := ReadyHere([]*discoveryv1.EndpointSlice{
		slice("local-here", "n1", nil), // unset Ready counts as ready
		slice("local-elsewhere", "n2", &yes),
		slice("local-not-ready", "n1", &no),
	}, "n1")
	got := ServiceRoutes(labels.SelectorFromSet(announce), svcs, ready)
	var want []netip.Prefix
	for _, p := range []string{"192.0.2.10/32", "192.0.2.11/32", "192.0.2.20/32", "2001:db8:ff::10/128"} {
		want = append(want, netip.MustParsePrefix(p))
	}
	if !slices.Equal(got, want) {
		t.Errorf("routes = %v, want %v", got, want)
	}
	if got := ServiceRoutes(nil, svcs, ready); got != nil {
		t.Errorf("nil selector: %v", got)
	}
}

func TestServiceSelectorInvalid(t *testing.T) {
	spec := coordinov1alpha1.BGPPeerPolicySpec{LocalASN: 64512, Peers: []coordinov1alpha1.BGPPeer{{Address: "192.0.2.1", ASN: 65000}},
		ServiceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Sometimes"}}}}
	if _, err := FromSpec(spec, nil); err == nil || !strings.Contains(err.Error(), "serviceSelector") {
		t.Fatalf("FromSpec = %v, want an error naming serviceSelector", err)
	}
	spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"bgp": "announce"}}
	c, err := FromSpec(spec, nil)
	if err != nil || c.Services == nil || !c.Services.Matches(labels.Set{"bgp": "announce"}) {
		t.Fatalf("FromSpec = %+v, %v", c, err)
	}
}
