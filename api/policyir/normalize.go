package policyir

import (
	"fmt"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	coordinov1alpha1 "github.com/coordino/coordino/api/coordino/v1alpha1"
)

// Normalize validates np and returns its normalized form. The error names
// the policy and the first bad field; an invalid policy has no IR.
// It is Compile followed by FromSpec, so a policy read from a file and one
// received as a PolicyIR object end up the same.
func Normalize(np *networkingv1.NetworkPolicy) (*Policy, error) {
	spec, err := Compile(np)
	if err != nil {
		return nil, err
	}
	return FromSpec(np.Namespace, np.Name, spec)
}

// Compile validates np and returns the PolicyIR spec the controller
// publishes for it.
func Compile(np *networkingv1.NetworkPolicy) (*coordinov1alpha1.PolicyIRSpec, error) {
	if err := ValidateNetworkPolicy(np); err != nil {
		return nil, fmt.Errorf("networkpolicy %s/%s: %w", np.Namespace, np.Name, err)
	}
	spec := &coordinov1alpha1.PolicyIRSpec{PodSelector: *np.Spec.PodSelector.DeepCopy(), PolicyTypes: []string{}}
	ingress, egress := policyTypes(np)
	if ingress {
		spec.PolicyTypes = append(spec.PolicyTypes, string(networkingv1.PolicyTypeIngress))
		for _, r := range np.Spec.Ingress {
			spec.Rules = append(spec.Rules, compileRule(networkingv1.PolicyTypeIngress, r.From, r.Ports))
		}
	}
	if egress {
		spec.PolicyTypes = append(spec.PolicyTypes, string(networkingv1.PolicyTypeEgress))
		for _, r := range np.Spec.Egress {
			spec.Rules = append(spec.Rules, compileRule(networkingv1.PolicyTypeEgress, r.To, r.Ports))
		}
	}
	return spec, nil
}

// policyTypes applies the API default: Ingress always, Egress when the
// policy has egress rules.
func policyTypes(np *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(np.Spec.PolicyTypes) == 0 {
		return true, len(np.Spec.Egress) > 0
	}
	for _, t := range np.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

func compileRule(dir networkingv1.PolicyType, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) coordinov1alpha1.PolicyRule {
	r := coordinov1alpha1.PolicyRule{Direction: string(dir)}
	for _, peer := range peers {
		r.Peers = append(r.Peers, compilePeer(peer))
	}
	for _, port := range ports {
		proto, _ := protoNumber(port.Protocol)
		switch {
		case port.Port == nil:
			r.Ports = append(r.Ports, coordinov1alpha1.PolicyPortRange{Protocol: int32(proto), First: 0, Last: 65535})
		case port.Port.Type == intstr.String:
			// Resolved on each node from the pods' container ports.
			r.NamedPorts = append(r.NamedPorts, coordinov1alpha1.PolicyNamedPort{Protocol: int32(proto), Name: port.Port.StrVal})
		default:
			lo := port.Port.IntVal
			hi := lo
			if port.EndPort != nil {
				hi = *port.EndPort
			}
			r.Ports = append(r.Ports, coordinov1alpha1.PolicyPortRange{Protocol: int32(proto), First: lo, Last: hi})
		}
	}
	return r
}

// compilePeer converts a validated peer: CIDRs canonical, the pod selector
// of a selector peer always set.
func compilePeer(peer networkingv1.NetworkPolicyPeer) coordinov1alpha1.PolicyPeer {
	if b := peer.IPBlock; b != nil {
		cidr, _ := parseCIDR(b.CIDR)
		block := &coordinov1alpha1.PolicyIPBlock{CIDR: cidr.String()}
		for _, e := range b.Except {
			ex, _ := parseCIDR(e)
			block.Except = append(block.Except, ex.String())
		}
		return coordinov1alpha1.PolicyPeer{IPBlock: block}
	}
	out := coordinov1alpha1.PolicyPeer{PodSelector: &metav1.LabelSelector{}}
	if peer.PodSelector != nil {
		out.PodSelector = peer.PodSelector.DeepCopy()
	}
	out.NamespaceSelector = peer.NamespaceSelector.DeepCopy()
	return out
}
