package k8s

import (
	"net/netip"
	"testing"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/coordino/coordino/daemon/identity"
)

// TestEndpointsSpec: only endpoints on a cluster identity are published,
// with their pod's named ports, sorted by address.
func TestEndpointsSpec(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	_ = idx.Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: 8080}, {ContainerPort: 9090}, {Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}}}}}})
	s := &Source{log: zap.NewNop()}
	spec := s.endpointsSpec(&liveView{pods: corelisters.NewPodLister(idx)}, []LocalEndpoint{
		{PodNamespace: "ns", PodName: "web", Identity: 300,
			Addresses: []netip.Addr{netip.MustParseAddr("fd00::9"), netip.MustParseAddr("10.0.0.9")}},
		{PodNamespace: "ns", PodName: "new", Identity: identity.FirstNodeLocal + 1, Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.2")}},
		{PodNamespace: "ns", PodName: "gone", Identity: 301, Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}},
	})
	if spec.EndpointCount != 2 || len(spec.Endpoints) != 2 {
		t.Fatalf("published %+v: want the two endpoints on cluster identities", spec.Endpoints)
	}
	first, web := spec.Endpoints[0], spec.Endpoints[1]
	if first.Addresses[0] != "10.0.0.1" || first.Identity != 301 || len(first.NamedPorts) != 0 {
		t.Errorf("first entry %+v, want 10.0.0.1 on 301 without ports (its pod is not in the cache)", first)
	}
	if web.Identity != 300 || len(web.Addresses) != 2 || web.Addresses[0] != "10.0.0.9" {
		t.Errorf("web entry %+v", web)
	}
	if len(web.NamedPorts) != 2 || web.NamedPorts[0].Name != "http" || web.NamedPorts[0].Protocol != "TCP" ||
		web.NamedPorts[1].Name != "dns" || web.NamedPorts[1].Protocol != "UDP" || web.NamedPorts[1].Port != 53 {
		t.Errorf("web named ports %+v, want http/TCP/8080 and dns/UDP/53", web.NamedPorts)
	}
}
