package ir

import (
	"fmt"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Normalize validates np and returns its normalized form. The error names
// the policy and the first bad field; an invalid policy has no IR.
func Normalize(np *networkingv1.NetworkPolicy) (*Policy, error) {
	if err := ValidateNetworkPolicy(np); err != nil {
		return nil, fmt.Errorf("networkpolicy %s/%s: %w", np.Namespace, np.Name, err)
	}
	p := &Policy{Namespace: np.Namespace, Name: np.Name}
	p.PodSelector, _ = metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	p.IsolatesIngress, p.IsolatesEgress = policyTypes(np)
	if p.IsolatesIngress {
		for i, r := range np.Spec.Ingress {
			p.Rules = append(p.Rules, p.rule(fmt.Sprintf("spec.ingress[%d]", i), Ingress, r.From, r.Ports))
		}
	}
	if p.IsolatesEgress {
		for i, r := range np.Spec.Egress {
			p.Rules = append(p.Rules, p.rule(fmt.Sprintf("spec.egress[%d]", i), Egress, r.To, r.Ports))
		}
	}
	return p, nil
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

func (p *Policy) rule(field string, dir Direction, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) Rule {
	r := Rule{Direction: dir}
	for _, peer := range peers {
		r.Peers = append(r.Peers, normalizePeer(peer))
	}
	for i, port := range ports {
		proto, _ := protoNumber(port.Protocol)
		switch {
		case port.Port == nil:
			r.Ports = append(r.Ports, PortRange{Protocol: proto, First: 0, Last: 65535})
		case port.Port.Type == intstr.String:
			// Named ports need the pods' container ports (Kubernetes mode).
			p.Warnings = append(p.Warnings, fmt.Sprintf(
				"networkpolicy %s/%s: %s.ports[%d]: named port %q matches nothing without pod port data",
				p.Namespace, p.Name, field, i, port.Port.StrVal))
		default:
			lo := uint16(port.Port.IntVal)
			hi := lo
			if port.EndPort != nil {
				hi = uint16(*port.EndPort)
			}
			r.Ports = append(r.Ports, PortRange{Protocol: proto, First: lo, Last: hi})
		}
	}
	r.NoPorts = len(ports) > 0 && len(r.Ports) == 0
	return r
}

// normalizePeer converts a validated peer.
func normalizePeer(peer networkingv1.NetworkPolicyPeer) Peer {
	if b := peer.IPBlock; b != nil {
		block := &IPBlock{}
		block.CIDR, _ = parseCIDR(b.CIDR)
		for _, e := range b.Except {
			ex, _ := parseCIDR(e)
			block.Except = append(block.Except, ex)
		}
		return Peer{Block: block}
	}
	out := Peer{PodSelector: labels.Everything()}
	if peer.PodSelector != nil {
		out.PodSelector, _ = metav1.LabelSelectorAsSelector(peer.PodSelector)
	}
	if peer.NamespaceSelector != nil {
		out.NamespaceSelector, _ = metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
	}
	return out
}
