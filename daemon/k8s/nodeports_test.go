package k8s

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/coordino/coordino/daemon/postdnat"
)

func nodePortSvc(ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: ports}}
}

func names(nps []postdnat.NodePort) string {
	var s []string
	for _, np := range nps {
		s = append(s, np.String())
	}
	slices.Sort(s)
	return strings.Join(s, " ")
}

// TestNodePortsDeltas: each Service or Node event sends only what it
// changes: a port two Services share goes with the last of them, an
// address change carries every port, and nothing is sent before sync.
func TestNodePortsDeltas(t *testing.T) {
	type change struct{ add, del string }
	var got []change
	n := NewNodePorts(func(add, del []postdnat.NodePort) {
		got = append(got, change{names(add), names(del)})
	})
	expect := func(step string, want ...change) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Errorf("%s: sent %q, want %q", step, got, want)
		}
		got = nil
	}
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	n.SetNodeAddresses([]netip.Addr{a})
	n.SetService("s1", nodePortSvc(corev1.ServicePort{Protocol: corev1.ProtocolTCP, NodePort: 30080}))
	expect("before sync")
	if all := names(n.All()); all != "10.0.0.1:30080/tcp" {
		t.Fatalf("All before sync: %q", all)
	}
	n.Synced()

	n.SetService("s2", nodePortSvc(corev1.ServicePort{Protocol: corev1.ProtocolTCP, NodePort: 30080},
		corev1.ServicePort{Protocol: corev1.ProtocolUDP, NodePort: 30053},
		corev1.ServicePort{Protocol: corev1.ProtocolTCP, Port: 80})) // no nodePort (ClusterIP)
	expect("second Service sharing a port", change{"10.0.0.1:30053/udp", ""})
	n.SetService("s1", nil)
	expect("first deleted: its port is still the second's")
	n.SetNodeAddresses([]netip.Addr{a, b})
	expect("address added", change{"[fd00::1]:30053/udp [fd00::1]:30080/tcp", ""})
	n.SetService("s2", nodePortSvc(corev1.ServicePort{Protocol: corev1.ProtocolTCP, NodePort: 30081}))
	expect("ports changed", change{"10.0.0.1:30081/tcp [fd00::1]:30081/tcp",
		"10.0.0.1:30053/udp 10.0.0.1:30080/tcp [fd00::1]:30053/udp [fd00::1]:30080/tcp"})
	n.SetNodeAddresses([]netip.Addr{b})
	expect("address removed", change{"", "10.0.0.1:30081/tcp"})
	n.SetService(types.UID("s2"), nil)
	expect("last deleted", change{"", "[fd00::1]:30081/tcp"})
	if all := n.All(); len(all) != 0 {
		t.Errorf("All after every Service went: %v", all)
	}
}

// TestNodeAddresses: InternalIP and ExternalIP, not host names.
func TestNodeAddresses(t *testing.T) {
	node := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}, {Type: corev1.NodeHostName, Address: "n1"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.5"}, {Type: corev1.NodeInternalIP, Address: "not-an-ip"},
		{Type: corev1.NodeInternalIP, Address: "::ffff:10.0.0.1"},
	}}}
	got := nodeAddresses(node)
	want := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("203.0.113.5")}
	if !slices.Equal(got, want) {
		t.Errorf("nodeAddresses = %v, want %v", got, want)
	}
}
